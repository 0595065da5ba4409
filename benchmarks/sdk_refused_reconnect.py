"""The SDKs' reconnect loop against members that never give a session: connection
attempts per minute and the client process's CPU once the back-off is at its ceiling::

    .venv/bin/python benchmarks/sdk_refused_reconnect.py --mode expired
    .venv/bin/python benchmarks/sdk_refused_reconnect.py --mode expired --js
    .venv/bin/python benchmarks/sdk_refused_reconnect.py --js --delays 3e6 3e6 0 \
        --warmup 5 --seconds 10   # a back-off past setTimeout's 24.8 days

``--mode``: ``expired`` (every ``connect`` closed 4503 TOKEN_EXPIRED, whatever fresh
token the token provider gives), ``denied`` (4003 CONNECT_DENIED: terminal, the client
ends at the first), ``down`` (nothing listens: TCP refused), ``silent`` (TCP accepted,
never a word), ``upgrade-close`` (the WebSocket upgrade answered, the connection
dropped at once), ``mixed`` (one member of each of the last three kinds); three
members. The client runs in its own process with the default ReconnectPolicy (0.5 s
doubling to 30 s, jitter 0.5; ``--delays``: other ones) and a token provider; after
``--warmup`` s it counts its token-provider calls (one per attempt) and CPU seconds
(user + system) for ``--seconds``. ``--js``: the browser SDK in node (clients/js after
``npm ci``; node's own WebSocket). Loopback only; each run ends by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import resource
import sys
import time
from pathlib import Path

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from migratory.protocol import close_codes

JS = Path(__file__).resolve().parents[1] / "clients" / "js"
NODE_CLIENT = """
import { connect } from "./src/index.js";
const [servers, warmup, seconds, delays] = JSON.parse(process.argv[1]);
const reconnect = delays ? { initialDelay: delays[0], maxDelay: delays[1], jitter: delays[2] } : {};
let tokens = 0, downs = 0;
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const client = connect(servers, { tokenProvider: () => `t${++tokens}`, reconnect,
  WebSocket: globalThis.WebSocket });
client.onNotification((n) => { if (n.status === "SERVER_DOWN") downs += 1; });
setTimeout(() => {
  const before = { tokens, cpu: cpu() };
  setTimeout(async () => {
    console.log(JSON.stringify({ warmup_tokens: before.tokens,
      window_tokens: tokens - before.tokens,
      server_down: downs, error: client.error ? String(client.error) : null,
      window_cpu_s: cpu() - before.cpu, rss_mb: process.memoryUsage().rss / 2 ** 20 }));
    await client.close();
  }, seconds * 1000);
}, warmup * 1000);
"""


async def refusing_member(mode: str, task_status: trio.TaskStatus[str]) -> None:
    """A member that never gives a session, in the way ``mode`` says."""
    if mode == "silent":
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        held: list[trio.SocketStream] = []

        async def hold(stream: trio.SocketStream) -> None:
            held.append(stream)  # kept open, never read or written
            await trio.sleep_forever()

        task_status.started(f"ws://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
        await trio.serve_listeners(hold, listeners)
        return
    if mode == "down":
        sock = trio.socket.socket()
        await sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        task_status.started(f"ws://127.0.0.1:{sock.getsockname()[1]}")
        await trio.sleep_forever()

    async def handle(request: WebSocketRequest) -> None:
        ws = await request.accept(subprotocol="migratory.cbor")
        if mode == "upgrade-close":
            await ws._stream.aclose()  # no close frame
            return
        code = close_codes.TOKEN_EXPIRED if mode == "expired" else close_codes.CONNECT_DENIED
        with contextlib.suppress(ConnectionClosed):  # a client that gave up first
            await ws.get_message()  # the client's connect
            await ws.aclose(code.code, "refused")

    async with trio.open_nursery() as nursery:
        serve = functools.partial(serve_websocket, handle, "127.0.0.1", 0, None)
        server = await nursery.start(serve)
        task_status.started(f"ws://127.0.0.1:{server.port}")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def python_client(
    servers: list[str], warmup: float, seconds: float, delays: list[float] | None
) -> dict[str, object]:
    import migratory_client as mc

    tokens = 0
    downs = 0

    def provider() -> str:
        nonlocal tokens
        tokens += 1
        return f"t{tokens}"

    async def count_downs(client: mc.Client) -> None:
        nonlocal downs
        with contextlib.suppress(mc.MigratoryError):
            async for note in client.notifications():  # ends with the client's error
                downs += note.status is mc.NotificationStatus.SERVER_DOWN

    policy = mc.ReconnectPolicy(*delays) if delays else mc.ReconnectPolicy()
    async with (
        mc.connect(servers, token_provider=provider, reconnect=policy) as client,
        trio.open_nursery() as n,
    ):
        n.start_soon(count_downs, client)
        await trio.sleep(warmup)
        before_tokens, before_cpu = tokens, cpu_seconds()
        await trio.sleep(seconds)
        figures: dict[str, object] = {
            "warmup_tokens": before_tokens, "window_tokens": tokens - before_tokens,
            "server_down": downs, "error": str(client.error) if client.error else None,
            "window_cpu_s": round(cpu_seconds() - before_cpu, 3),
            "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        n.cancel_scope.cancel()
    return figures


MODES = ("expired", "denied", "down", "silent", "upgrade-close")


async def main(args: argparse.Namespace) -> None:
    kinds = ["down", "silent", "upgrade-close"] if args.mode == "mixed" else [args.mode] * 3
    async with trio.open_nursery() as nursery:
        servers = [await nursery.start(refusing_member, kind) for kind in kinds]
        if args.js:
            command = ["node", "--experimental-websocket", "--input-type=module", "-e",
                       NODE_CLIENT, json.dumps([servers, args.warmup, args.seconds, args.delays])]
        else:
            command = [sys.executable, __file__, "--client",
                       json.dumps([servers, args.warmup, args.seconds, args.delays])]
        started = time.monotonic()
        done = await trio.run_process(command, cwd=JS if args.js else None, capture_stdout=True)
        figures = json.loads(done.stdout.decode().strip().splitlines()[-1])
        figures["wall_s"] = round(time.monotonic() - started, 1)
        per_second = figures["window_tokens"] / args.seconds
        figures["window_attempts_per_minute"] = round(per_second * 60, 1)
        figures["window_cpu_ms_per_30s"] = round(figures["window_cpu_s"] * 30e3 / args.seconds, 1)
        print(json.dumps({"sdk": "js" if args.js else "python", "mode": args.mode, **figures}))
        nursery.cancel_scope.cancel()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=(*MODES, "mixed"), default="expired")
    parser.add_argument("--warmup", type=float, default=60.0,
                        help="seconds before the window: the back-off reaches max_delay")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--js", action="store_true")
    parser.add_argument("--delays", type=float, nargs=3, metavar=("INITIAL", "MAX", "JITTER"),
                        help="the policy's initial and max delay (s) and jitter, not 0.5 30 0.5")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        print(json.dumps(trio.run(python_client, *json.loads(args.client))))
        return
    trio.run(main, args)


if __name__ == "__main__":
    cli()
