"""The Raft port's message encryption: AES-256-GCM in place of pysyncobj's Fernet.

pysyncobj seals every message between seeds with the cluster password through an
"encryptor" (``encrypt_at_time``, ``extract_timestamp``, ``decrypt``). Its own is
Fernet -- AES-CBC, an HMAC and two base64 passes in Python objects -- which took about
a sixth of the leader's CPU at 1,000 publishes/s and, measured with the seal removed,
about 1.5 ms of the acknowledgement's median (docs/benchmarks.md). :class:`RaftCipher`
keeps the same interface and the same guarantee (no byte is accepted, or read, without
the password) with one AEAD call per message.

Keys and nonces: the password gives a master key (PBKDF2-SHA256, as pysyncobj derives
Fernet's); each cipher -- one per process -- draws a random 16-byte key id and seals
with its own key, HKDF(master, key id), and a counter as the nonce. A nonce therefore
never repeats under one key, however long the cluster runs (random 96-bit nonces under
one shared key would, in principle, after 2**32 messages). A receiver derives the key
of each sender's id once and keeps a bounded number of them.

Wire: ``key id (16) | timestamp (8) | nonce (12) | ciphertext and tag``; the key id and
the timestamp are authenticated as associated data. pysyncobj checks the timestamp
never goes back on a connection before it decrypts, and drops the connection when
``decrypt`` raises (any error: a wrong password, a forged or cut message).
"""

from __future__ import annotations

import itertools
import os
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

KEY_ID_SIZE = 16
NONCE_SIZE = 12
_TIMESTAMP = struct.Struct("!q")
HEADER_SIZE = KEY_ID_SIZE + _TIMESTAMP.size + NONCE_SIZE
MAX_PEER_KEYS = 256
"""Keys of other senders kept (a seed restarts with a new key id each time)."""
_SALT = b"migratory raft cipher v1"
_PBKDF2_ITERATIONS = 100_000


class RaftCipher:
    """pysyncobj's encryptor interface, sealed with AES-256-GCM."""

    def __init__(self, password: str) -> None:
        if not password:
            raise ValueError("the Raft cipher needs the cluster password")
        kdf = PBKDF2HMAC(
            algorithm=hashes.SHA256(), length=32, salt=_SALT, iterations=_PBKDF2_ITERATIONS
        )
        self._master = kdf.derive(password.encode())
        self.key_id = os.urandom(KEY_ID_SIZE)
        self._own = AESGCM(self._key(self.key_id))
        self._peers: dict[bytes, AESGCM] = {self.key_id: self._own}
        self._nonces = itertools.count(1)  # next() is atomic under the GIL

    def _key(self, key_id: bytes) -> bytes:
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_SALT + key_id)
        return hkdf.derive(self._master)

    def encrypt_at_time(self, data: bytes, timestamp: int) -> bytes:
        nonce = next(self._nonces).to_bytes(NONCE_SIZE, "big")
        associated = self.key_id + _TIMESTAMP.pack(timestamp)
        return associated + nonce + self._own.encrypt(nonce, data, associated)

    def extract_timestamp(self, token: bytes) -> int:
        """The sender's timestamp, not authenticated yet (:meth:`decrypt` checks it)."""
        if len(token) < HEADER_SIZE:
            raise ValueError(f"sealed message too short: {len(token)} bytes")
        (timestamp,) = _TIMESTAMP.unpack_from(token, KEY_ID_SIZE)
        return int(timestamp)

    def decrypt(self, token: bytes) -> bytes:
        """The plain message; raises (``InvalidTag``, ``ValueError``) unless it is whole
        and sealed with the cluster password."""
        if len(token) < HEADER_SIZE:
            raise ValueError(f"sealed message too short: {len(token)} bytes")
        key_id = bytes(token[:KEY_ID_SIZE])
        associated = bytes(token[: KEY_ID_SIZE + _TIMESTAMP.size])
        nonce = bytes(token[KEY_ID_SIZE + _TIMESTAMP.size : HEADER_SIZE])
        sealed = bytes(token[HEADER_SIZE:])
        aead = self._peers.get(key_id)
        if aead is not None:
            return aead.decrypt(nonce, sealed, associated)
        aead = AESGCM(self._key(key_id))
        plain = aead.decrypt(nonce, sealed, associated)
        # kept only once a message proved the sender has the password
        if len(self._peers) >= MAX_PEER_KEYS:
            self._peers = {self.key_id: self._own}
        self._peers[key_id] = aead
        return plain
