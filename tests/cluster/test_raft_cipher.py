"""The Raft port's seal (AES-256-GCM in pysyncobj's encryptor interface): nothing is
read without the cluster password, any changed byte is refused, nonces never repeat."""

from __future__ import annotations

import pytest
from cryptography.exceptions import InvalidTag

from cluster import raft_cipher
from cluster.raft_cipher import HEADER_SIZE, KEY_ID_SIZE, RaftCipher

PASSWORD = "raft-cipher-password"


@pytest.fixture(scope="module")
def pair() -> tuple[RaftCipher, RaftCipher]:
    return RaftCipher(PASSWORD), RaftCipher(PASSWORD)


def test_a_message_sealed_by_one_seed_opens_at_another(
    pair: tuple[RaftCipher, RaftCipher],
) -> None:
    sender, receiver = pair
    token = sender.encrypt_at_time(b"append_entries", 1234)
    assert b"append_entries" not in token
    assert receiver.extract_timestamp(token) == 1234
    assert receiver.decrypt(token) == b"append_entries"
    assert sender.decrypt(token) == b"append_entries"  # its own, too


def test_each_process_seals_with_its_own_key(pair: tuple[RaftCipher, RaftCipher]) -> None:
    sender, receiver = pair
    assert sender.key_id != receiver.key_id
    assert sender.encrypt_at_time(b"m", 1)[:KEY_ID_SIZE] == sender.key_id


def test_another_password_cannot_open_it(pair: tuple[RaftCipher, RaftCipher]) -> None:
    token = pair[0].encrypt_at_time(b"secret", 1)
    with pytest.raises(InvalidTag):
        RaftCipher("another password").decrypt(token)


@pytest.mark.parametrize("where", ["key id", "timestamp", "nonce", "ciphertext", "tag"])
def test_any_changed_byte_is_refused(pair: tuple[RaftCipher, RaftCipher], where: str) -> None:
    sender, receiver = pair
    token = bytearray(sender.encrypt_at_time(b"commit index 42", 7))
    index = {"key id": 3, "timestamp": KEY_ID_SIZE + 7, "nonce": HEADER_SIZE - 1,
             "ciphertext": HEADER_SIZE + 2, "tag": len(token) - 1}[where]
    token[index] ^= 0x01
    with pytest.raises(InvalidTag):
        receiver.decrypt(bytes(token))


def test_a_cut_message_is_refused_with_a_clear_error(pair: tuple[RaftCipher, RaftCipher]) -> None:
    sender, receiver = pair
    token = sender.encrypt_at_time(b"x" * 100, 1)
    with pytest.raises(ValueError, match="too short"):
        receiver.extract_timestamp(token[: HEADER_SIZE - 1])
    with pytest.raises(ValueError, match="too short"):
        receiver.decrypt(token[:10])
    with pytest.raises(InvalidTag):
        receiver.decrypt(token[:-5])


def test_nonces_never_repeat_under_one_key(pair: tuple[RaftCipher, RaftCipher]) -> None:
    sender = pair[0]
    nonces = {sender.encrypt_at_time(b"m", 1)[KEY_ID_SIZE + 8 : HEADER_SIZE] for _ in range(5000)}
    assert len(nonces) == 5000


def test_garbage_key_ids_are_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unauthenticated peer cannot fill the key table: a key is kept only after a
    message sealed with it opened."""
    monkeypatch.setattr(raft_cipher, "MAX_PEER_KEYS", 4)
    receiver = RaftCipher(PASSWORD)
    for n in range(10):
        forged = bytes([n]) * KEY_ID_SIZE + bytes(40)
        with pytest.raises(InvalidTag):
            receiver.decrypt(forged)
    assert len(receiver._peers) == 1
    senders = [RaftCipher(PASSWORD) for _ in range(6)]  # more than the table holds
    for sender in senders:
        assert receiver.decrypt(sender.encrypt_at_time(b"hello", 1)) == b"hello"
    assert len(receiver._peers) <= 4
    assert receiver.decrypt(senders[0].encrypt_at_time(b"again", 2)) == b"again"


def test_an_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="needs the cluster password"):
        RaftCipher("")


def test_a_seed_raft_node_seals_with_it_not_fernet() -> None:
    from cluster.raft import RaftCoordination
    from cluster.tooling import free_base_port

    address = ("127.0.0.1", free_base_port(1))
    node = RaftCoordination(
        self_address=address, seed_addresses=[address], password=PASSWORD,
        on_commit=lambda _batch: None,
    )
    try:
        assert isinstance(node.syncobj.encryptor, RaftCipher)
        assert node.syncobj._getEncryptor() is node.syncobj.encryptor
    finally:
        node.close()
