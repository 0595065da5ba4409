#!/usr/bin/env python3
"""CPU per TLS record, sealed (server) and opened (client), over N connections in memory.

Pairs of ``ssl.SSLObject`` on memory BIOs (TLS 1.3, a trustme certificate, no sockets):
each round seals one record of ``--size`` bytes on every connection in turn (as the
server writes one batch per connection), then opens each on its client (as each
subscriber reads it). CPU time (``time.process_time``) over a whole pass, so it holds
on a busy machine; the clock is read twice per pass, not per record (one read costs
~0.8 us on the 2-core VM, which inflated the earlier per-record timing).

What makes a record dear is whether the connection's OpenSSL state is still in the
CPU's caches when its next record comes, not how many connections there are:
``--gap-ms`` sleeps between rounds (other processes run, as between two batch ticks of
the server), ``--churn-mib`` walks that much memory between rounds. ``--suite`` picks
the TLS 1.3 cipher suite (Python 3.11's ``ssl`` cannot: it is set on both contexts
through libssl's ``SSL_CTX_set_ciphersuites``, and checked after the handshake).

    .venv/bin/python benchmarks/tls_record_cpu.py [--connections 1 10 100 1000] [--size 184]
    .venv/bin/python benchmarks/tls_record_cpu.py --connections 100 1000 --gap-ms 10
    .venv/bin/python benchmarks/tls_record_cpu.py --connections 1000 --suite TLS_AES_128_GCM_SHA256
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import ssl
import time

import trustme

Pair = tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.SSLObject, ssl.MemoryBIO]
SUITES = ("TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256")


def set_suite(context: ssl.SSLContext, suite: str) -> None:
    """TLS 1.3 suites of ``context`` (CPython keeps the ``SSL_CTX *`` right after the
    object header of an ``ssl.SSLContext``; the negotiated suite is checked by the caller)."""
    libssl = ctypes.CDLL(ctypes.util.find_library("ssl"))
    libssl.SSL_CTX_set_ciphersuites.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if libssl.SSL_CTX_set_ciphersuites(pointer, suite.encode()) != 1:
        raise SystemExit(f"libssl refused the suite {suite}")


def contexts(suite: str | None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    if suite:
        set_suite(server, suite)
        set_suite(client, suite)
    return server, client


def pair(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> Pair:
    """A client and a server ``SSLObject`` with the handshake done (bounded rounds)."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side, out, peer_in in ((client, c_out, s_in), (server, s_out, c_in)):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
            data = out.read()
            if data:
                peer_in.write(data)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.read(1)  # the session tickets
    return client, c_in, server, s_out


def measure(
    pairs: list[Pair], records: int, size: int, gap: float, churn: int
) -> tuple[float, float]:
    """CPU µs per seal and per open, ``records`` records in all, round-robin."""
    payload = b"x" * size
    clock = time.process_time
    memory = bytearray(churn) if churn else None
    seal = opened = 0.0
    rounds = max(3, records // len(pairs))
    if gap or churn:
        rounds = min(rounds, 200)  # bounded: a pause or a memory walk per round
    for _ in range(rounds):
        if gap:
            time.sleep(gap)
        if memory is not None:
            memory[:] = bytes(churn)
        t0 = clock()
        sealed = []
        for _client, _c_in, server, s_out in pairs:
            server.write(payload)
            sealed.append(s_out.read())
        t1 = clock()
        if gap:
            time.sleep(gap)
        if memory is not None:
            memory[:] = bytes(churn)
        t2 = clock()
        for (client, c_in, _server, _s_out), record in zip(pairs, sealed, strict=True):
            c_in.write(record)
            client.read(65536)
        seal += t1 - t0
        opened += clock() - t2
    done = rounds * len(pairs)
    return 1e6 * seal / done, 1e6 * opened / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--records", type=int, default=20000, help="records per figure")
    parser.add_argument("--size", type=int, default=184,
                        help="plaintext bytes per record (184: one native frame of 100 B)")
    parser.add_argument("--gap-ms", type=float, nargs="+", default=[0.0],
                        help="sleep between rounds (repeatable values: one figure each)")
    parser.add_argument("--churn-mib", type=int, default=0,
                        help="walk this much memory between rounds")
    parser.add_argument("--suite", choices=SUITES, help="TLS 1.3 cipher suite")
    args = parser.parse_args()
    server_ctx, client_ctx = contexts(args.suite)
    for count in args.connections:
        pairs = [pair(server_ctx, client_ctx) for _ in range(count)]
        negotiated = pairs[0][2].cipher()
        suite = negotiated[0] if negotiated else "?"
        if args.suite and suite != args.suite:
            raise SystemExit(f"negotiated {suite}, not {args.suite}")
        measure(pairs, 2 * count, args.size, 0.0, 0)  # first records: buffers, tickets
        for gap in args.gap_ms:
            seal, opened = measure(pairs, args.records, args.size, gap / 1000,
                                   args.churn_mib << 20)
            print(f"{count:5} connections, gap {gap:4.0f} ms, churn {args.churn_mib} MiB: "
                  f"seal {seal:.2f} us, open {opened:.2f} us per {args.size}-byte record "
                  f"({suite})", flush=True)


if __name__ == "__main__":
    main()
