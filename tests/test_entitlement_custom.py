"""Entitlement = Custom attacked: a plugin that blocks, raises SystemExit, answers
something not a bool or is async; clients whose tokens are 64 kB; identities built to
collide in the decision cache."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import warnings
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest

from migratory.entitlement_custom import CustomEntitlement, load_plugin
from migratory.entitlement_decisions import ClientIdentity, DecisionPending, deferred_decisions


def who(name: str = "alice", token: str | None = "t", peer: str = "127.0.0.1:1") -> ClientIdentity:
    return ClientIdentity(name, token, peer)


class Gated:
    """Subscribes wait for the gate (at most 2 s: without a timeout on our side, the
    first check would wait for it and then allow)."""

    def __init__(self, options: str) -> None:
        self.gate = threading.Event()
        self.calls = 0

    def allow_connect(self, client: Any) -> bool:
        self.calls += 1
        return True

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        self.calls += 1
        self.gate.wait(2.0)
        return True

    def allow_publish(self, client: Any, subject: str) -> bool:
        self.calls += 1
        return True


def test_a_plugin_that_blocks_is_denied_at_the_timeout_and_fails_closed_until_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = Gated("")
    entitlement = CustomEntitlement(plugin, timeout=0.05)
    try:
        assert not entitlement.allow_subscribe(who(), "/a/b")  # the plugin is still waiting
        assert plugin.calls == 1 and entitlement.failures == 1
        # while that call runs, nothing uncached is asked: denied at once, whoever asks
        assert not entitlement.allow_subscribe(who("bob"), "/a/c")
        assert not entitlement.allow_connect(who("carol"))
        assert plugin.calls == 1 and entitlement.failures == 3
        assert "test_entitlement_custom:Gated" in caplog.text
        assert "EntitlementPluginTimeout" in caplog.text
    finally:
        plugin.gate.set()
    late = entitlement._running  # type: ignore[attr-defined]
    assert late is not None
    late.result(timeout=5)  # the late call returns (its answer is not used)
    assert entitlement.allow_subscribe(who("bob"), "/a/c")
    assert entitlement.allow_subscribe(who(), "/a/b")  # the timed-out one was not cached
    assert plugin.calls == 3


class Odd:
    def __init__(self, options: str) -> None:
        self.calls = 0

    def allow_connect(self, client: Any) -> Any:
        self.calls += 1
        raise SystemExit(3)  # a plugin calling sys.exit() must not stop the server

    def allow_subscribe(self, client: Any, subject: str) -> Any:
        self.calls += 1
        return {"/a/1": 1, "/a/2": "yes", "/a/3": None, "/a/4": [True]}.get(subject, True)

    def allow_publish(self, client: Any, subject: str) -> Any:
        async def later() -> bool:
            return True

        return later()  # a coroutine, never awaited


def test_a_plugin_that_exits_or_answers_garbage_denies_and_is_named_once_per_method(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entitlement = CustomEntitlement(Odd(""), timeout=5)
    caplog.set_level(logging.WARNING, "migratory.entitlement")
    assert not entitlement.allow_connect(who())
    assert entitlement.failures == 1 and "SystemExit" in caplog.text
    assert [entitlement.allow_subscribe(who(), f"/a/{i}") for i in range(1, 6)] == [
        False, False, False, False, True]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not entitlement.allow_publish(who(), "/a/1")
        assert not entitlement.allow_publish(who(), "/a/2")
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    odd = [r.getMessage() for r in caplog.records if "not a bool" in r.getMessage()]
    assert len(odd) == 2  # allow_subscribe once, allow_publish once: not one per call
    assert all("test_entitlement_custom:Odd" in line for line in odd)


def test_an_async_plugin_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    module = types.ModuleType("async_rules")

    class Rules(Gated):
        async def allow_subscribe(self, client: Any, subject: str) -> bool:  # type: ignore[override]
            return True

    module.Rules = Rules  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "async_rules", module)
    with pytest.raises(ValueError, match="allow_subscribe must be plain functions"):
        load_plugin("async_rules:Rules", "")


class ByToken:
    def __init__(self, options: str) -> None:
        self.calls = 0

    def allow_connect(self, client: Any) -> bool:
        self.calls += 1
        return client.token == "good"

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        return client.name == "a"

    def allow_publish(self, client: Any, subject: str) -> bool:
        return False


def test_decisions_are_cached_by_digest_and_identities_do_not_collide() -> None:
    plugin = ByToken("")
    entitlement = CustomEntitlement(plugin)
    for i in range(100):  # clients with 60 kB tokens each
        assert not entitlement.allow_connect(who(token=f"{i}" + "x" * 60_000))
    decisions = entitlement._decisions  # type: ignore[attr-defined]
    assert len(decisions) == 100 and all(len(key) == 32 for key in decisions)
    # the same strings split differently between the fields are other identities
    assert entitlement.allow_subscribe(who("a", "b\0c"), "/s/t")
    assert not entitlement.allow_subscribe(who("a\0b", "c"), "/s/t")
    assert entitlement.allow_connect(who(token="good"))
    assert not entitlement.allow_connect(who(token=None))
    assert not entitlement.allow_connect(who(token="None"))
    assert not entitlement.allow_connect(who(token="\udcff"))  # not UTF-8: asked, denied


class Raising:
    def __init__(self, options: str) -> None:
        pass

    def allow_connect(self, client: Any) -> bool:
        return True

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        raise KeyError(subject)  # a subject the rules never expected, every time

    def allow_publish(self, client: Any, subject: str) -> bool:
        return True


def test_a_plugin_failing_on_every_call_does_not_flood_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entitlement = CustomEntitlement(Raising(""))
    caplog.set_level(logging.WARNING, "migratory.entitlement")
    denied = sum(not entitlement.allow_subscribe(who(), f"/odd/{i}") for i in range(500))
    assert denied == 500 and entitlement.failures == 500  # every one denied and counted
    logged = [r for r in caplog.records if "failed (denied)" in r.getMessage()]
    assert 1 <= len(logged) <= 2  # one per FAILURE_LOG_INTERVAL (10 s), not one per call


def test_a_token_over_64_kib_is_refused_without_asking_the_plugin() -> None:
    """A native connect may carry a 1 MiB token: hashed for the decision cache at each of
    a 1,000-entry subscribe, it cost the server ~1 ms of CPU per entry."""
    from migratory.entitlement_decisions import MAX_TOKEN_CHARS

    plugin = ByToken("")
    entitlement = CustomEntitlement(plugin)
    assert not entitlement.allow_connect(who(token="g" * (MAX_TOKEN_CHARS + 1)))
    assert not entitlement.allow_subscribe(who(token="g" * (1 << 20)), "/s/t")
    assert plugin.calls == 0 and not entitlement._decisions  # type: ignore[attr-defined]
    assert not entitlement.allow_connect(who(token="g" * MAX_TOKEN_CHARS))  # asked
    assert plugin.calls == 1


class Failing(Gated):
    def allow_publish(self, client: Any, subject: str) -> bool:
        self.calls += 1
        raise RuntimeError("rules service down")


def test_deferred_decisions_wait_outside_the_caller_and_end_in_an_answer_or_a_denial() -> None:
    """Inside deferred_decisions (the native session), an uncached decision is not waited
    for: DecisionPending with the plugin's future and a deadline; asked again once the
    future is done, the answer (cached); past the deadline, denied and fail closed as
    before; a plugin that raised is denied once, not asked again and again."""
    plugin = Failing("")
    entitlement = CustomEntitlement(plugin, timeout=0.5)
    with deferred_decisions():
        with pytest.raises(DecisionPending) as waiting:
            entitlement.allow_subscribe(who(), "/a/b")
        with pytest.raises(DecisionPending):  # asked again before it is in: still waiting
            entitlement.allow_subscribe(who(), "/a/b")
        plugin.gate.set()
        assert waiting.value.future.result(timeout=5) is True
        assert entitlement.allow_subscribe(who(), "/a/b")
        assert entitlement.allow_subscribe(who(), "/a/b")  # cached
        assert plugin.calls == 1
        with pytest.raises(DecisionPending) as failing:
            entitlement.allow_publish(who(), "/a/b")
        failing.value.future.exception(timeout=5)
        assert not entitlement.allow_publish(who(), "/a/b")  # denied, not a new call
        assert plugin.calls == 2 and entitlement.failures == 1
        plugin.gate.clear()
        with pytest.raises(DecisionPending) as late:
            entitlement.allow_subscribe(who(), "/a/late")
        for _ in range(500):  # until the plugin is in that call (a queued one is withdrawn)
            if plugin.calls == 3:
                break
            time.sleep(0.01)
        entitlement._pending[next(iter(entitlement._pending))] = (  # type: ignore[attr-defined]
            late.value.future, 0.0)  # its deadline passed
        assert not entitlement.allow_subscribe(who(), "/a/late")
        assert not entitlement.allow_subscribe(who(), "/a/other")  # fail closed meanwhile
        assert entitlement.failures == 3
    plugin.gate.set()
    late.value.future.result(timeout=5)
    assert entitlement.allow_subscribe(who(), "/a/other")  # outside: waited for here
    assert plugin.calls == 4  # /a/other was not asked while /a/late ran late


def test_a_decision_asked_ahead_that_failed_is_denied_again_without_a_new_call() -> None:
    """MQTT asks a packet's decisions ahead (deferred), then handles the packet, which
    asks them again outside: a plugin that raised is not called a second time there
    (that call would hold the event loop); the next packet asks it afresh."""
    plugin = Failing("")
    entitlement = CustomEntitlement(plugin, timeout=0.5)
    with deferred_decisions(ahead=True):
        with pytest.raises(DecisionPending) as ahead:
            entitlement.allow_publish(who(), "/a/b")
        ahead.value.future.exception(timeout=5)
        assert not entitlement.allow_publish(who(), "/a/b")
    assert not entitlement.allow_publish(who(), "/a/b")  # the packet itself: no new call
    assert plugin.calls == 1
    assert not entitlement.allow_publish(who(), "/a/b")  # the next packet: asked again
    assert plugin.calls == 2 and entitlement.failures == 2


def test_a_call_still_queued_at_its_deadline_is_never_made() -> None:
    """Deferred decisions queue in the plugin's one thread: one still queued when its
    session gives up (the deadline) is withdrawn, so a burst of sessions does not leave
    a backlog of calls that nobody waits for."""
    plugin = Gated("")
    entitlement = CustomEntitlement(plugin, timeout=0.05)
    with deferred_decisions():
        with pytest.raises(DecisionPending) as first:
            entitlement.allow_subscribe(who("a"), "/a/b")  # runs, held by the gate
        for _ in range(500):  # until the plugin is in that call
            if plugin.calls == 1:
                break
            time.sleep(0.01)
        with pytest.raises(DecisionPending) as queued:
            entitlement.allow_subscribe(who("b"), "/a/b")  # waits behind it
        for waiting in (first, queued):  # each session waits until its deadline
            with contextlib.suppress(FutureTimeout):
                waiting.value.future.result(timeout=waiting.value.deadline - time.monotonic())
        assert not entitlement.allow_subscribe(who("b"), "/a/b")
        assert queued.value.future.cancelled()
        assert not entitlement.allow_subscribe(who("a"), "/a/b")  # running late
        assert not first.value.future.cancelled()
    plugin.gate.set()
    first.value.future.result(timeout=5)
    assert entitlement.allow_subscribe(who("b"), "/a/b")  # asked now, answered
    assert plugin.calls == 2  # a's, then b's second ask: the queued one was never made


def test_a_decision_left_pending_by_a_session_gone_is_waited_for_by_a_blocking_ask() -> None:
    """A session that asked deferred and went away leaves its call pending; the same
    decision asked outside deferred_decisions waits for that call (within its deadline)
    instead of raising DecisionPending where nobody catches it."""
    plugin = Gated("")
    entitlement = CustomEntitlement(plugin, timeout=5.0)
    with deferred_decisions(), pytest.raises(DecisionPending):
        entitlement.allow_subscribe(who(), "/a/b")
    opener = threading.Timer(0.2, plugin.gate.set)  # while the ask below waits
    opener.start()
    assert entitlement.allow_subscribe(who(), "/a/b")
    assert plugin.calls == 1
    opener.join()
