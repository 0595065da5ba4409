"""Clients of encrypted listeners are written every ``EncryptedBatchTime`` (a whole
number of batch ticks), idle ones still at once: fewer TLS records, each ~4 us of CPU
on both sides."""

from __future__ import annotations

import pytest

from migratory.config import load_config
from migratory.server.app import Server
from migratory.server.encrypted_batching import EncryptedBatches, ticks_per_encrypted_batch


class Link:
    """Stands in for a Connection: the batch ticks flush it."""

    def __init__(self, *, encrypted: bool) -> None:
        self.batch_slowly = encrypted
        self.flushes = 0
        self.session = None  # (the server forgets its heartbeats)

    def flush(self) -> None:
        self.flushes += 1


@pytest.mark.parametrize(
    ("batch_time", "encrypted_batch_time", "ticks"),
    [(10, 20, 2), (10, 30, 3), (10, 24, 2), (10, 10, 1), (10, 5, 1), (10, 0, 1), (0, 20, 1),
     (5, 20, 4)],
)
def test_an_encrypted_batch_spans_whole_ticks(
    batch_time: int, encrypted_batch_time: int, ticks: int
) -> None:
    assert ticks_per_encrypted_batch(batch_time, encrypted_batch_time) == ticks


def test_a_busy_encrypted_connection_waits_for_the_end_of_the_period() -> None:
    batches: EncryptedBatches[str] = EncryptedBatches(2)
    assert batches.mark("a") is True  # idle: at once
    assert batches.mark("a") is False  # written this period: waits
    assert batches.tick() == set()  # the first tick of the period writes nothing
    assert batches.tick() == {"a"}  # the period's end does
    assert batches.mark("a") is False  # written in this period
    assert batches.tick() == set() and batches.tick() == {"a"}
    for _ in range(2):  # a whole period with nothing written
        batches.tick()
    assert batches.mark("a") is False  # written in the period before: still busy
    batches.dirty.clear()
    for _ in range(2):
        batches.tick()
    assert batches.mark("a") is True  # two periods quiet: idle again


def test_without_idle_write_every_encrypted_message_waits() -> None:
    batches: EncryptedBatches[str] = EncryptedBatches(3, idle_write=False)
    assert batches.mark("a") is False
    assert [batches.tick() for _ in range(3)] == [set(), set(), {"a"}]


def test_a_forgotten_connection_is_not_written() -> None:
    batches: EncryptedBatches[str] = EncryptedBatches(2)
    batches.mark("a")
    batches.mark("a")
    batches.forget("a")
    assert batches.tick() == set() and batches.tick() == set()
    assert batches.mark("a") is True


def test_at_least_two_ticks() -> None:
    with pytest.raises(ValueError, match="2 ticks"):
        EncryptedBatches(1)


def _server(**settings: str) -> Server:
    return Server(load_config(overrides={"Listen": "127.0.0.1:0", **settings}, environ={}))


def test_the_server_writes_a_busy_tls_client_every_other_tick_and_a_plain_one_every_tick() -> None:
    server = _server(EncryptedBatchTime="20")  # BatchTime 10 (the default)
    plain, encrypted = Link(encrypted=False), Link(encrypted=True)
    for link in (plain, encrypted):
        server.mark_dirty(link)  # type: ignore[arg-type]
    assert server.urgent == {plain, encrypted}  # both idle: at once
    server.write_urgent()
    assert (plain.flushes, encrypted.flushes) == (1, 1)
    for tick in range(1, 7):
        for link in (plain, encrypted):
            server.mark_dirty(link)  # type: ignore[arg-type]
        assert not server.urgent  # both busy now
        server.batch_tick()
        assert plain.flushes == 1 + tick
        assert encrypted.flushes == 1 + tick // 2
    server.forget(encrypted)  # type: ignore[arg-type]
    assert server.encrypted is not None and not server.encrypted.dirty


def test_encrypted_batch_time_at_most_batch_time_batches_like_the_rest() -> None:
    server = _server(EncryptedBatchTime="10")
    assert server.encrypted is None


def test_the_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="EncryptedBatchTime"):
        load_config(overrides={"EncryptedBatchTime": "-1"}, environ={})
    assert load_config(overrides={}, environ={}).encrypted_batch_time == 0  # off
    assert _server().encrypted is None
