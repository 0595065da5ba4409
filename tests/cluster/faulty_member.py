"""A member process with failures injected into named handlers (tests only).

``python faulty_member.py serve --set ...`` runs ``migratory serve`` after patching
each handler named in ``MIGRATORY_TEST_FAULTS`` (comma-separated
``module:Qualified.name@N``) so that its Nth call raises
``RuntimeError("injected failure in Qualified.name")`` -- once; every other call runs
the real handler. Works for plain and async functions and methods.

``module:Qualified.name~SECONDS`` instead makes every call of a plain function or method
wait SECONDS first (a slow step, e.g. a seed's replay of its journal made long enough
to be caught in the middle on a loaded box).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable
from typing import Any

FAULTS_ENV = "MIGRATORY_TEST_FAULTS"


def parse(spec: str) -> list[tuple[str, str, int | float]]:
    """``module:Qualified.name@N`` items: (module, qualified name, N: int);
    ``module:Qualified.name~SECONDS`` items: (module, qualified name, SECONDS: float)."""
    faults: list[tuple[str, str, int | float]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if "~" in item:
            target, _, wait = item.partition("~")
            module, _, qualname = target.partition(":")
            faults.append((module, qualname, float(wait)))
            continue
        target, _, nth = item.partition("@")
        module, _, qualname = target.partition(":")
        faults.append((module, qualname, int(nth or "1")))
    return faults


def slowed(name: str, real: Callable[..., Any], wait: float) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(real):
        raise ValueError(f"{name}: only a plain function can be slowed")

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        time.sleep(wait)
        return real(*args, **kwargs)

    return wrapper


def failing(name: str, real: Callable[..., Any], nth: int) -> Callable[..., Any]:
    calls = 0

    def due() -> bool:
        nonlocal calls
        calls += 1
        return calls == nth

    if inspect.iscoroutinefunction(real):

        @functools.wraps(real)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if due():
                raise RuntimeError(f"injected failure in {name}")
            return await real(*args, **kwargs)

        return async_wrapper

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if due():
            raise RuntimeError(f"injected failure in {name}")
        return real(*args, **kwargs)

    return wrapper


def inject(spec: str) -> None:
    for module_name, qualname, how in parse(spec):
        owner: Any = importlib.import_module(module_name)
        *path, attribute = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = getattr(owner, attribute)
        patched = slowed(qualname, real, how) if isinstance(how, float) else failing(
            qualname, real, how)
        setattr(owner, attribute, patched)


if __name__ == "__main__":
    inject(os.environ.get(FAULTS_ENV, ""))
    from cluster.cli import main

    sys.exit(main(sys.argv[1:]))
