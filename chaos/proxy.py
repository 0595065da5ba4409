"""In-process trio TCP proxies (loopback) with delay / blackhole / reset / one-way partition.

One ``Proxy`` listens on a public port and forwards each connection to an upstream
port. ``forward`` is the client->upstream direction (into the member), ``backward``
the reply direction. Faults:

- ``delay``: every chunk is forwarded ``delay`` seconds after it was read (both ways; a
  latency: the chunks after it are read meanwhile);
- ``blackhole``: nothing is forwarded either way (bytes are held, connections stay open;
  new connections are accepted and stall);
- ``partition``: one-way — only the direction into the member is held (bytes are not
  dropped: a TCP stream cannot lose bytes in the middle, it stalls; dropping them
  corrupted the encrypted Raft stream in early runs);
- ``reset``: every open connection is closed at once (new ones are accepted), or only
  those coming from given local ports (one member process's: :func:`local_ports`).

For the scenarios, a proxy can also refuse the connections of one process
(``refuse``) and count the bytes it forwards to one process (``follow``), e.g. the
cache sync a seed sends to a restarted non-seed.
"""

from __future__ import annotations

import builtins
import contextlib
import os

import trio

IN_FLIGHT = 64  # chunks (of at most 64 KiB) a direction reads ahead of what it forwarded


class Follow:
    """Bytes forwarded to one process's connections; ``reached`` is set at ``threshold``."""

    def __init__(self, pid: int, threshold: int) -> None:
        self.pid, self.threshold = pid, threshold
        self.bytes = 0
        self.first: float | None = None  # trio time of its first connection
        self.reached = trio.Event()

    def add(self, n: int) -> None:
        self.bytes += n
        if self.bytes >= self.threshold:
            self.reached.set()


class Proxy:
    def __init__(self, name: str, listen_port: int, upstream_port: int) -> None:
        self.name = name
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.delay = 0.0
        self.blackhole = False
        self.inbound_dropped = False  # one-way partition: into the member (held)
        self._scopes: dict[trio.CancelScope, int] = {}  # -> the connecting peer's port
        self._changed = trio.Event()
        self.refused_pid: int | None = None
        self.followed: Follow | None = None

    def refuse(self, pid: int | None) -> None:
        """Close new connections from process ``pid`` as they are accepted (None: stop)."""
        self.refused_pid = pid

    def follow(self, pid: int | None, threshold: int = 0) -> Follow | None:
        """Count the bytes forwarded to connections that process ``pid`` opens from now on."""
        self.followed = Follow(pid, threshold) if pid is not None else None
        return self.followed

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

    def reset(self, from_ports: builtins.set[int] | None = None) -> int:
        """Close the open connections (only those from ``from_ports`` when given)."""
        scopes = [s for s, port in self._scopes.items() if from_ports is None or port in from_ports]
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.listen_port, host="127.0.0.1")
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, downstream: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            try:
                peer_port = int(downstream.socket.getpeername()[1])
            except OSError:
                peer_port = 0
            self._scopes[scope] = peer_port
            refused, followed = self.refused_pid, self.followed
            if refused is not None and peer_port in local_ports(refused):
                scope.cancel()
            if followed is not None and peer_port not in local_ports(followed.pid):
                followed = None
            if followed is not None and followed.first is None:
                followed.first = trio.current_time()
            try:
                try:
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
                except OSError:
                    return
                async with trio.open_nursery() as nursery:
                    scope_ = nursery.cancel_scope
                    ends = [0]  # directions at their end of stream
                    nursery.start_soon(
                        self._pump, downstream, upstream, True, scope_, None, ends
                    )
                    nursery.start_soon(
                        self._pump, upstream, downstream, False, scope_, followed, ends
                    )
            finally:
                self._scopes.pop(scope, None)
        with contextlib.suppress(Exception):
            await trio.aclose_forcefully(downstream)
        with contextlib.suppress(Exception):
            if "upstream" in locals():
                await trio.aclose_forcefully(upstream)

    async def _pump(
        self,
        src: trio.SocketStream,
        dst: trio.SocketStream,
        inbound: bool,
        scope: trio.CancelScope,
        followed: Follow | None,
        ends: list[int],
    ) -> None:
        """Forward ``src`` to ``dst``. At the end of ``src``'s stream (its peer shut down
        writing: a server that sent its close frame and lingers) ``dst`` is half-closed
        and the other direction goes on, as through a plain TCP path: closing both at
        once reset a client still sending and dropped what it had not read yet (a
        drain's statuses and 4502 close frame). An error ends both directions.

        The delay is a latency, not a pace: each chunk goes out ``delay`` s after it was
        read, while the next ones are read meanwhile (at most :data:`IN_FLIGHT` chunks
        held). Before, the pump slept ``delay`` after each read and only then read the
        next chunk: a link delayed 300 ms delivered what came in bursts every 300 ms (a
        Raft heartbeat sent every 40 ms reached the follower every 300 ms, longer than
        its election timeout) and carried at most 64 KiB per 300 ms."""
        send, receive = trio.open_memory_channel[tuple[float, bytes]](IN_FLIGHT)
        half_closed = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, src, send)
                half_closed = await self._write(receive, dst, inbound, followed, ends)
                nursery.cancel_scope.cancel()
        finally:
            if not half_closed:
                scope.cancel()

    async def _write(
        self,
        receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
        dst: trio.SocketStream,
        inbound: bool,
        followed: Follow | None,
        ends: list[int],
    ) -> bool:
        """Forward what ``_read`` read, each chunk once its delay is over; whether ``dst``
        was half-closed (the other direction goes on)."""
        try:
            async for read_at, data in receive:
                if not data:
                    ends[0] += 1
                    if ends[0] < 2:
                        await dst.send_eof()
                        return True
                    return False
                while self.blackhole:  # hold the bytes until healed (or reset)
                    await self._changed.wait()
                while inbound and self.inbound_dropped:  # one way: held until healed
                    await self._changed.wait()
                if self.delay:
                    await trio.sleep_until(read_at + self.delay)
                await dst.send_all(data)
                if followed is not None:
                    followed.add(len(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        return False

    @staticmethod
    async def _read(
        src: trio.SocketStream, send: trio.MemorySendChannel[tuple[float, bytes]]
    ) -> None:
        """Read ``src`` into ``send``, each chunk with the time it was read; b"" at its end
        (an error ends it too: the pump then ends both directions)."""
        async with send:
            try:
                while data := await src.receive_some(65536):
                    await send.send((trio.current_time(), data))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            await send.send((trio.current_time(), b""))


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets (from /proc; empty if it is gone)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return set()
    return {int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[9] in inodes}
