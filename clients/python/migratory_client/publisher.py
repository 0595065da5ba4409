"""A blocking publisher for scripts: one client on a trio loop in a background thread.

with Publisher(servers=["ws://127.0.0.1:8800"]) as pub:
    result = pub.publish("/a/b", b"x", fields={"k": "v"}, retained=True)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping
from functools import partial
from types import TracebackType

import trio

from migratory.model.message import Qos
from migratory_client.backoff import ReconnectPolicy
from migratory_client.client import Client, connect
from migratory_client.errors import ClientClosedError
from migratory_client.events import PublishResult

__all__ = ["Publisher"]

_START_TIMEOUT = 10.0


class Publisher:
    """Synchronous facade over :class:`Client` for publishing from plain Python code."""

    def __init__(
        self,
        servers: Iterable[str] | str,
        token: str | None = None,
        *,
        name: str = "publisher",
        reconnect: ReconnectPolicy | None = None,
    ) -> None:
        self._open = partial(connect, servers, token=token, name=name, reconnect=reconnect)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._client: Client | None = None
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._failure: BaseException | None = None

    def __enter__(self) -> Publisher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("Publisher already started")
        self._thread = threading.Thread(target=self._thread_main, name="migratory-publisher")
        self._thread.daemon = True
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT):
            raise RuntimeError("the publisher's trio thread did not start")
        if self._failure is not None:
            raise self._failure

    def _thread_main(self) -> None:
        try:
            trio.run(self._hold_client)
        except BaseException as exc:  # handed to the caller thread
            self._failure = exc
        finally:
            self._ready.set()

    async def _hold_client(self) -> None:
        self._stop = trio.Event()
        async with self._open() as client:
            self._client = client
            self._trio_token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()

    def publish(
        self,
        subject: str,
        content: bytes | str,
        fields: Mapping[str, str] | None = None,
        *,
        retained: bool = False,
        qos: Qos = Qos.STANDARD,
        timeout: float = 10.0,
    ) -> PublishResult:
        """Publish and wait for the status; raises as :meth:`Client.publish` does."""
        client, token = self._client, self._trio_token
        if client is None or token is None or self._stop is None or self._stop.is_set():
            raise ClientClosedError()
        publish = partial(
            client.publish, subject, content, fields, retained=retained, qos=qos, timeout=timeout
        )
        return trio.from_thread.run(publish, trio_token=token)

    def close(self) -> None:
        """Close the session and stop the background thread. Idempotent."""
        thread, token, stop = self._thread, self._trio_token, self._stop
        if thread is None or token is None or stop is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join()
