"""``Entitlement = Custom``: a Python plugin named in the config (``module:Class``).

The class implements the entitlement interface (:class:`migratory.entitlement_decisions.Entitlement`
without ``name``)::

    class MyRules:
        def __init__(self, options: str) -> None: ...      # EntitlementPluginOptions
        def allow_connect(self, client) -> bool: ...
        def allow_subscribe(self, client, subject) -> bool: ...
        def allow_publish(self, client, subject) -> bool: ...

``client`` is a :class:`migratory.entitlement_decisions.ClientIdentity` (name, token, peer). The
plugin is called only on connect, subscribe and publish checks -- never on the fan-out
path -- and each decision is cached per client identity and subject (bounded, keyed by
a digest: a client's token may be 64 kB), so a plugin is asked once per session and
subject; a token over 64 KiB is denied without asking. A plugin that raises
(``SystemExit`` too), or answers anything but ``True``, denies; the error is logged
naming the plugin (at most once per 10 s, the others counted in the next line) and
counted, and the server carries on.

The plugin runs in one thread of its own, one call at a time; an answer is waited for at
most ``EntitlementPluginTimeout``: a call that takes longer denies, and until it returns
every decision the cache does not hold is denied at once (fail closed). A native
WebSocket session asks inside :func:`~migratory.entitlement_decisions.deferred_decisions`: it gets
:class:`~migratory.entitlement_decisions.DecisionPending`, puts its operation back and waits
(reading nothing more) while the event loop serves the others; an MQTT packet's and an
HTTP request's decisions are asked ahead the same way (``deferred_decisions(ahead=True)``).
(An MQTT will is asked with its CONNECT, to be published from the decision cached.)
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NoReturn

from migratory.entitlement_decisions import (
    MAX_TOKEN_CHARS,
    DecisionPending,
    decisions_asked_ahead,
    decisions_deferred,
)

log = logging.getLogger("migratory.entitlement")

MAX_CACHED_DECISIONS = 100_000
FAILURE_LOG_INTERVAL = 10.0
"""Seconds between two logged failures (the others are counted in the next line): a
client whose every subscribe makes the plugin raise must not flood the log."""
METHODS = ("allow_connect", "allow_subscribe", "allow_publish")
MAX_PENDING = 10_000
"""Decisions waited for by sessions at once, past which those answered or past their
deadline (of sessions gone meanwhile) are forgotten."""


def load_plugin(spec: str, options: str) -> Any:
    """Import ``module:Class`` and build it with ``options``; ValueError saying why not."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"expected module:Class, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, class_name)
        plugin = factory(options)
    except Exception as exc:
        raise ValueError(f"cannot load {spec!r}: {type(exc).__name__}: {exc}") from None
    missing = [name for name in METHODS if not callable(getattr(plugin, name, None))]
    if missing:
        raise ValueError(f"{spec!r} does not implement {', '.join(missing)}")
    asynchronous = [name for name in METHODS
                    if inspect.iscoroutinefunction(getattr(plugin, name))]
    if asynchronous:
        raise ValueError(f"{spec!r}: {', '.join(asynchronous)} must be plain functions "
                         "returning True or False, not async")
    return plugin


class PluginThread:
    """One daemon thread that runs the plugin's calls in turn (a daemon: a call stuck
    for good does not hold the process at exit)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._calls = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="entitlement-plugin",
                                            daemon=True)
            self._thread.start()
        future: Future[Any] = Future()
        self._calls.put((future, function, args))
        return future

    def _run(self) -> None:
        while True:
            future, function, args = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args))
            except BaseException as exc:  # the caller decides; this thread goes on
                future.set_exception(exc)


class CustomEntitlement:
    name = "Custom"

    def __init__(self, plugin: Any, *, timeout: float = 0.5) -> None:
        self._plugin = plugin
        self._plugin_name = f"{type(plugin).__module__}:{type(plugin).__qualname__}"
        self._timeout = timeout
        self._thread = PluginThread()
        self._running: Future[Any] | None = None  # a call past the timeout, still running
        self._decisions: OrderedDict[bytes, bool] = OrderedDict()
        # calls a session waits for without holding the loop (deferred_decisions)
        self._pending: dict[bytes, tuple[Future[Any], float]] = {}
        self._failed_ahead: dict[bytes, bool] = {}  # failed when asked ahead (MQTT)
        self._odd_answers: set[str] = set()  # methods that answered something not a bool
        self.failures = 0
        self._unlogged = 0  # failures since the last one logged
        self._log_after = 0.0  # time.monotonic() from which the next failure is logged
        """Calls that raised, timed out or were not made while one ran late (each denied)."""

    def _ask(self, method: str, client: Any, *subject: str) -> bool:
        if client.token is not None and len(client.token) > MAX_TOKEN_CHARS:
            return False  # not asked, not hashed at each decision: refused unread
        key = _decision_key(method, client, *subject)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        if self._failed_ahead.pop(key, False):
            return False  # asked ahead (deferred) and failed: denied once more, not re-asked
        try:
            answer = self._answer(key, method, client, *subject)
        except DecisionPending:
            raise
        except BaseException as exc:  # a failing plugin denies, never crashes the server
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._failed(method, exc)
            if decisions_asked_ahead():  # the operation asks again at once: the same answer
                self._failed_ahead[key] = True
                if len(self._failed_ahead) > MAX_PENDING:
                    self._failed_ahead.pop(next(iter(self._failed_ahead)))
            return False  # not cached: a transient failure is asked again
        decision = answer is True
        if not isinstance(answer, bool):
            self._odd_answer(method, answer)
        self._decisions[key] = decision
        if len(self._decisions) > MAX_CACHED_DECISIONS:
            self._decisions.popitem(last=False)
        return decision

    def _answer(self, key: bytes, method: str, *args: Any) -> Any:
        """The plugin's answer: waited for here, or -- inside deferred_decisions --
        DecisionPending until it is in; past the deadline a TimeoutError."""
        waiting = self._pending.pop(key, None)  # (one whose session went away, maybe)
        if waiting is None:
            waiting = (self._start(method, *args), time.monotonic() + self._timeout)
        future, deadline = waiting
        if not decisions_deferred():
            try:
                return future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                self._late(future)
        if future.done():
            return future.result()
        if time.monotonic() >= deadline:
            self._late(future)
        if len(self._pending) >= MAX_PENDING:
            now = time.monotonic()
            self._pending = {k: (f, d) for k, (f, d) in self._pending.items()
                             if not f.done() and d > now}
        self._pending[key] = waiting
        raise DecisionPending(future, deadline)

    def _start(self, method: str, *args: Any) -> Future[Any]:
        late = self._running
        if late is not None:
            if not late.done():
                raise TimeoutError("an earlier call has not returned yet")
            self._running = None
            log.warning("entitlement plugin %s answers again", self._plugin_name)
        return self._thread.submit(getattr(self._plugin, method), *args)

    def _late(self, future: Future[Any]) -> NoReturn:
        if future.cancel():  # still queued behind others' calls: never made
            raise TimeoutError(f"not asked within EntitlementPluginTimeout "
                               f"({self._timeout * 1000:.0f} ms): earlier calls took it")
        self._running = future
        raise TimeoutError(f"no answer within EntitlementPluginTimeout "
                           f"({self._timeout * 1000:.0f} ms); decisions are denied "
                           "until it returns")

    def _failed(self, method: str, exc: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if now < self._log_after:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more failures not logged)" if self._unlogged else ""
        self._unlogged, self._log_after = 0, now + FAILURE_LOG_INTERVAL
        log.warning("entitlement plugin %s: %s failed (denied): %r%s", self._plugin_name,
                    method, exc, more)

    def _odd_answer(self, method: str, answer: Any) -> None:
        if inspect.iscoroutine(answer):
            answer.close()  # never awaited: no RuntimeWarning per call
        if method not in self._odd_answers:  # once per method: a wrong plugin, not a flood
            self._odd_answers.add(method)
            log.warning("entitlement plugin %s: %s answered %s, not a bool: denied",
                        self._plugin_name, method, type(answer).__name__)

    def expiry(self, client: Any) -> float | None:
        return None

    def not_yet_valid(self, client: Any) -> float | None:
        return None

    def allow_connect(self, client: Any) -> bool:
        return self._ask("allow_connect", client)

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        return self._ask("allow_subscribe", client, subject)

    def allow_publish(self, client: Any, subject: str) -> bool:
        return self._ask("allow_publish", client, subject)


def _decision_key(method: str, client: Any, *subject: str) -> bytes:
    """A digest of what a decision depends on (``repr`` of the tuple: unambiguous
    whatever the strings hold): 100,000 cached decisions of clients with 64 kB tokens
    hold 32 bytes each, not the tokens."""
    parts = (method, client.name, client.token, client.peer, *subject)
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogatepass")).digest()
