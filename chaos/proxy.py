"""In-process trio TCP proxies (loopback) with delay / blackhole / reset / one-way partition.

One ``Proxy`` listens on a public port and forwards each connection to an upstream
port. ``forward`` is the client->upstream direction (into the member), ``backward``
the reply direction. Faults:

- ``delay``: every chunk waits ``delay`` seconds before it is forwarded (both ways);
- ``blackhole``: nothing is forwarded either way (bytes are held, connections stay open;
  new connections are accepted and stall);
- ``partition``: one-way — only the direction into the member is held (bytes are not
  dropped: a TCP stream cannot lose bytes in the middle, it stalls; dropping them
  corrupted the encrypted Raft stream in early runs);
- ``reset``: every open connection is closed at once (new ones are accepted).
"""

from __future__ import annotations

import contextlib

import trio


class Proxy:
    def __init__(self, name: str, listen_port: int, upstream_port: int) -> None:
        self.name = name
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.delay = 0.0
        self.blackhole = False
        self.inbound_dropped = False  # one-way partition: into the member (held)
        self._scopes: set[trio.CancelScope] = set()
        self._changed = trio.Event()

    def set(
        self,
        *,
        delay: float | None = None,
        blackhole: bool | None = None,
        inbound_dropped: bool | None = None,
    ) -> None:
        if delay is not None:
            self.delay = delay
        if blackhole is not None:
            self.blackhole = blackhole
        if inbound_dropped is not None:
            self.inbound_dropped = inbound_dropped
        self._changed.set()
        self._changed = trio.Event()

    def heal(self) -> None:
        self.set(delay=0.0, blackhole=False, inbound_dropped=False)

    def reset(self) -> int:
        scopes = list(self._scopes)
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.listen_port, host="127.0.0.1")
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, downstream: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                try:
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
                except OSError:
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, downstream, upstream, True, nursery.cancel_scope)
                    nursery.start_soon(
                        self._pump, upstream, downstream, False, nursery.cancel_scope
                    )
            finally:
                self._scopes.discard(scope)
        with contextlib.suppress(Exception):
            await trio.aclose_forcefully(downstream)
        with contextlib.suppress(Exception):
            if "upstream" in locals():
                await trio.aclose_forcefully(upstream)

    async def _pump(
        self, src: trio.SocketStream, dst: trio.SocketStream, inbound: bool, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                data = await src.receive_some(65536)
                if not data:
                    break
                while self.blackhole:  # hold the bytes until healed (or reset)
                    await self._changed.wait()
                while inbound and self.inbound_dropped:  # one way: held until healed
                    await self._changed.wait()
                if self.delay:
                    await trio.sleep(self.delay)
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            scope.cancel()
