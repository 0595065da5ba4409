"""``Entitlement = Custom``: a Python plugin named in the config (``module:Class``).

The class implements the entitlement interface (:class:`migratory.entitlement.Entitlement`
without ``name``)::

    class MyRules:
        def __init__(self, options: str) -> None: ...      # EntitlementPluginOptions
        def allow_connect(self, client) -> bool: ...
        def allow_subscribe(self, client, subject) -> bool: ...
        def allow_publish(self, client, subject) -> bool: ...

``client`` is a :class:`migratory.entitlement.ClientIdentity` (name, token, peer). The
plugin is called only on connect, subscribe and publish checks -- never on the fan-out
path -- and each decision is cached per client identity and subject (bounded), so a
plugin is asked once per session and subject. A plugin that raises, or answers anything
but ``True``, denies; the error is logged and counted, and the server carries on.
"""

from __future__ import annotations

import importlib
import logging
from collections import OrderedDict
from typing import Any

log = logging.getLogger("migratory.entitlement")

MAX_CACHED_DECISIONS = 100_000


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
    missing = [
        name
        for name in ("allow_connect", "allow_subscribe", "allow_publish")
        if not callable(getattr(plugin, name, None))
    ]
    if missing:
        raise ValueError(f"{spec!r} does not implement {', '.join(missing)}")
    return plugin


class CustomEntitlement:
    name = "Custom"

    def __init__(self, plugin: Any) -> None:
        self._plugin = plugin
        self._decisions: OrderedDict[tuple[Any, ...], bool] = OrderedDict()
        self.failures = 0
        """Calls that raised (each one denied)."""

    def _ask(self, key: tuple[Any, ...], method: str, *args: Any) -> bool:
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        try:
            decision = getattr(self._plugin, method)(*args) is True
        except Exception as exc:  # a failing plugin denies, never crashes the server
            self.failures += 1
            log.warning("entitlement plugin %s failed (denied): %r", method, exc)
            return False  # not cached: a transient failure is asked again
        self._decisions[key] = decision
        if len(self._decisions) > MAX_CACHED_DECISIONS:
            self._decisions.popitem(last=False)
        return decision

    def expiry(self, client: Any) -> float | None:
        return None

    def allow_connect(self, client: Any) -> bool:
        return self._ask(("connect", client), "allow_connect", client)

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        return self._ask(("subscribe", client, subject), "allow_subscribe", client, subject)

    def allow_publish(self, client: Any, subject: str) -> bool:
        return self._ask(("publish", client, subject), "allow_publish", client, subject)
