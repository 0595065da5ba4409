"""The chaos proxy's per-process controls (real loopback sockets, one trio run each):
refuse one process's connections, count what is forwarded to it, reset only its links."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import trio
from listen_ports import listen_port

from chaos.proxy import Proxy, local_ports


def free_port() -> int:
    return listen_port()  # below the ephemeral range: tests/listen_ports.py


async def echo_server(port: int, task_status: trio.TaskStatus[None]) -> None:
    async def echo(stream: trio.SocketStream) -> None:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    task_status.started()
    await trio.serve_listeners(echo, listeners)


async def closed(stream: trio.SocketStream) -> bool:
    """The proxy closed this connection (EOF or reset) within 2 s."""
    with trio.move_on_after(2):
        try:
            await stream.send_all(b"ping")
            while await stream.receive_some(100):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


def run(test: object) -> None:
    async def main() -> None:
        upstream, public = free_port(), free_port()
        proxy = Proxy("test", public, upstream)
        async with trio.open_nursery() as nursery:
            await nursery.start(echo_server, upstream)
            await nursery.start(proxy.serve)
            with trio.fail_after(20):
                await test(proxy, public)  # type: ignore[operator]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_local_ports_are_this_process_sockets_only() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port in local_ports(os.getpid())
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert port not in local_ports(other.pid)
        finally:
            other.kill()
            other.wait()
    assert local_ports(2**22 + 12345) == set()  # no such process


def test_refuse_closes_that_process_connections_only() -> None:
    async def check(proxy: Proxy, public: int) -> None:
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            proxy.refuse(other.pid)  # another process: ours still pass
            stream = await trio.open_tcp_stream("127.0.0.1", public)
            await stream.send_all(b"hello")
            assert await stream.receive_some(100) == b"hello"
            proxy.refuse(os.getpid())
            refused = await trio.open_tcp_stream("127.0.0.1", public)
            assert await closed(refused)
            await stream.send_all(b"still")  # refusing is for new connections
            assert await stream.receive_some(100) == b"still"
            proxy.refuse(None)
            again = await trio.open_tcp_stream("127.0.0.1", public)
            await again.send_all(b"back")
            assert await again.receive_some(100) == b"back"
        finally:
            other.kill()
            other.wait()

    run(check)


def test_follow_counts_the_bytes_forwarded_to_that_process() -> None:
    async def check(proxy: Proxy, public: int) -> None:
        follow = proxy.follow(os.getpid(), threshold=100_000)
        assert follow is not None
        stream = await trio.open_tcp_stream("127.0.0.1", public)
        got = 0
        for rounds in range(1, 21):  # 8000 bytes out, the same 8000 echoed back
            await stream.send_all(b"x" * 8000)
            while got < 8000 * rounds:
                got += len(await stream.receive_some(65536))
            await trio.sleep(0.01)  # the proxy counts once its send returned
            if follow.reached.is_set():
                break
        assert follow.reached.is_set() and follow.bytes >= 100_000
        assert follow.bytes == got and follow.first is not None
        proxy.follow(None)
        assert proxy.followed is None

    run(check)


def test_reset_from_ports_closes_only_those_links() -> None:
    async def check(proxy: Proxy, public: int) -> None:
        mine = await trio.open_tcp_stream("127.0.0.1", public)
        other = await trio.open_tcp_stream("127.0.0.1", public)
        await trio.sleep(0.1)
        port = mine.socket.getsockname()[1]
        assert proxy.reset({port}) == 1
        assert await closed(mine)
        await other.send_all(b"alive")
        assert await other.receive_some(100) == b"alive"
        assert proxy.reset() == 1

    run(check)


def test_a_half_close_passes_through_and_the_other_direction_goes_on() -> None:
    """A server that sends its last bytes and shuts down writing (a draining member's
    4502 close frame, then its linger) while the client still sends: the client reads
    every byte, then the end of stream, and what it sends afterwards still reaches the
    server, as on a plain TCP path. Before: the proxy closed both sides at the server's
    end of stream (the server never got "late"; a client slow to read could lose the
    last bytes to the reset)."""

    async def main() -> None:
        upstream, public = free_port(), free_port()
        proxy = Proxy("half", public, upstream)
        got: list[bytes] = []

        async def server(stream: trio.SocketStream) -> None:
            await stream.send_all(b"bye")
            await stream.send_eof()
            with trio.move_on_after(2):
                while data := await stream.receive_some(100):
                    got.append(data)

        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(upstream, host="127.0.0.1")
            nursery.start_soon(trio.serve_listeners, server, listeners)
            await nursery.start(proxy.serve)
            with trio.fail_after(10):
                client = await trio.open_tcp_stream("127.0.0.1", public)
                received = b""
                while data := await client.receive_some(100):
                    received += data
                assert received == b"bye"  # then the end of stream
                await client.send_all(b"late")
                await client.aclose()
                with trio.move_on_after(2):
                    while b"".join(got) != b"late":
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert b"".join(got) == b"late"

    trio.run(main)


def test_a_delay_is_a_latency_not_a_pace() -> None:
    """Chunks sent every 40 ms through a 300 ms delay each arrive 300 ms after they were
    sent (mock time, memory streams). Before, the pump slept 300 ms after each read and
    only then read on: the second chunk (sent at 0.04 s) arrived at 0.6 s with the six
    after it, a Raft heartbeat every 300 ms instead of every 40 ms."""
    import trio.testing

    async def main() -> None:
        proxy = Proxy("test", 0, 0)
        proxy.set(delay=0.3)
        sender, src = trio.testing.memory_stream_pair()
        dst, receiver = trio.testing.memory_stream_pair()
        arrived: dict[int, float] = {}
        sent: dict[int, float] = {}

        async def read() -> None:
            buffer = b""
            while len(arrived) < 10:
                buffer += await receiver.receive_some(1000)
                for k in range(10):
                    if f"<{k}>".encode() in buffer and k not in arrived:
                        arrived[k] = trio.current_time()

        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            nursery.start_soon(proxy._pump, src, dst, True, scope, None, [0])  # type: ignore[arg-type]
            nursery.start_soon(read)
            for k in range(10):
                sent[k] = trio.current_time()
                await sender.send_all(f"<{k}>".encode())
                await trio.sleep(0.04)
            with trio.fail_after(5):
                while len(arrived) < 10:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert [round(arrived[k] - sent[k], 3) for k in range(10)] == [0.3] * 10

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
