"""The monitoring listener (``MonitorListen``): its own port for /metrics, /stats,
/cluster, /healthz, /readyz and the live dashboard (/dashboard), with optional HTTP
basic authentication (``MonitorUser`` / ``MonitorPassword``), as the seed's "HTTP
monitoring" port.

One request per connection, answered and closed, like the client port's plain HTTP.
A failure while serving one request ends that connection, logged; never the server.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from migratory.config import Config
from migratory.protocol.http import HttpError, Request, response
from migratory.protocol.http_server import RequestParser
from migratory.server.accept import serve_listeners
from migratory.server.dashboard import answer_dashboard
from migratory.tls import server_context

if TYPE_CHECKING:
    from migratory.server.context import ServerContext

log = logging.getLogger("migratory.monitor")

REQUEST_TIMEOUT = 10.0
MAX_CONNECTIONS = 64
"""Monitoring connections served at once; one more is answered 503 and closed at once.
They are not client connections (MaxConnections): unbounded, idle ones held for
REQUEST_TIMEOUT each could take the file descriptors FileDescriptorReserve keeps for
Raft and the cluster links."""
REFUSAL_SECONDS = 0.1
READ_SIZE = 16384
REALM = "migratory monitoring"


def basic_auth_ok(request: Request, user: str, password: str) -> bool:
    """Whether ``request`` carries ``Authorization: Basic`` with ``user:password``."""
    header = request.header("authorization") or ""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(given, f"{user}:{password}".encode())


def answer(ctx: ServerContext, request: Request) -> bytes:
    """The response of the monitoring listener to one parsed request."""
    config = ctx.config
    if request.path == "/healthz" and request.method in ("GET", "HEAD"):
        # no password: a kubelet's liveness probe has none to send, and "ok" tells nothing
        return response(200, b"ok\n")
    if config.monitor_user and not basic_auth_ok(
        request, config.monitor_user, config.monitor_password
    ):
        return response(
            401,
            b"authentication required\n",
            headers=(("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"'),),
        )
    if request.method not in ("GET", "HEAD"):
        return response(405, b"use GET\n", headers=(("Allow", "GET, HEAD"),))
    if request.path == "/readyz":
        reason = ctx.readiness()
        return response(200, b"ready\n") if reason is None else response(
            503, (reason + "\n").encode()
        )
    if ctx.monitor is not None:  # the live dashboard: /dashboard, /dashboard/config.json
        page = answer_dashboard(
            request.path, ctx.monitor.dashboard_config(), request.header("host")
        )
        if page is not None:
            return page
    routed = None if ctx.monitor is None else ctx.monitor.route(
        request, monitoring_listener=True
    )
    if routed is not None:
        return routed
    return response(
        404,
        f"no such path {request.path!r}; try /metrics, /stats, /cluster, /dashboard\n".encode(),
    )


async def serve_one(ctx: ServerContext, stream: trio.abc.Stream) -> None:
    parser = RequestParser()
    try:
        with trio.move_on_after(REQUEST_TIMEOUT):
            reply: bytes | None = None
            while reply is None:
                data = await stream.receive_some(READ_SIZE)
                if not data:
                    return
                try:
                    request = parser.receive_data(data)
                except HttpError as exc:
                    reply = exc.encode()
                    break
                if request is not None:
                    reply = answer(ctx, request)
            assert reply is not None
            await stream.send_all(reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:
        log.exception("monitoring listener: a request failed")
    finally:
        with trio.move_on_after(1):
            await stream.aclose()


async def refuse(stream: trio.SocketStream, *, plain: bool) -> None:
    """Over MAX_CONNECTIONS: say 503 (in clear text only: no TLS handshake is spent on
    it) if the socket takes it at once, and close."""
    try:
        if plain:
            with trio.move_on_after(REFUSAL_SECONDS):
                await stream.send_all(response(
                    503, f"too many monitoring connections ({MAX_CONNECTIONS})\n".encode(),
                    headers=(("Retry-After", "1"),)))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        with trio.move_on_after(1):
            await stream.aclose()


def monitoring_tls(config: Config) -> Callable[[trio.SocketStream], trio.abc.Stream] | None:
    """With ``MonitorEncrypted``: wrap each accepted stream in TLS (the encrypted client
    listeners' certificate and key, :func:`migratory.tls.server_context`)."""
    if not config.monitor_encrypted:
        return None
    context = server_context(config)

    def wrap(stream: trio.SocketStream) -> trio.abc.Stream:
        return trio.SSLStream(stream, context, server_side=True)

    return wrap


async def serve_monitoring(
    ctx: ServerContext,
    address: tuple[str, int],
    *,
    wrap: Callable[[trio.SocketStream], trio.abc.Stream] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the monitoring listener until cancelled; ``task_status`` gets its address.
    ``wrap`` turns an accepted stream into the one to speak on (TLS)."""
    host, port = address
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:  # trio's own text names neither the key nor, alone, the port
        raise OSError(exc.errno, f"cannot listen on {host}:{port} (MonitorListen): "
                      f"{exc.strerror or exc}") from None

    serving = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal serving
        if serving >= MAX_CONNECTIONS:
            await refuse(stream, plain=wrap is None)
            return
        serving += 1
        try:
            await serve_one(ctx, stream if wrap is None else wrap(stream))
        finally:
            serving -= 1

    bound = listeners[0].socket.getsockname()
    task_status.started((bound[0], bound[1]))
    await serve_listeners(handle, listeners, name="monitoring listener")
