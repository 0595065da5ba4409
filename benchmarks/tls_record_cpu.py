#!/usr/bin/env python3
"""CPU per TLS record, sealed (server) and opened (client), over N connections in memory.

Pairs of ``ssl.SSLObject`` on memory BIOs (TLS 1.3, a trustme certificate, no sockets):
each round seals one record of ``--size`` bytes on every connection in turn and opens
it on its client, the way the server writes one batch per connection and each
subscriber reads it. With many connections each one's OpenSSL state is cold in the
CPU's caches by its next turn: that, not the bytes, is what a TLS write costs in the
fan-out (docs/tls.md). CPU time (``time.process_time``), so it holds on a busy machine.

    .venv/bin/python benchmarks/tls_record_cpu.py [--connections 1 10 100 1000] [--size 150]
"""

from __future__ import annotations

import argparse
import contextlib
import ssl
import time

import trustme

Pair = tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.SSLObject, ssl.MemoryBIO]


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
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


def measure(pairs: list[Pair], records: int, size: int) -> tuple[float, float]:
    """CPU µs per seal and per open, ``records`` records in all, round-robin."""
    payload = b"x" * size
    clock = time.process_time
    seal = opened = 0.0
    rounds = max(1, records // len(pairs))
    for _ in range(rounds):
        for client, c_in, server, s_out in pairs:
            t0 = clock()
            server.write(payload)
            record = s_out.read()
            t1 = clock()
            c_in.write(record)
            client.read(65536)
            opened += clock() - t1
            seal += t1 - t0
    done = rounds * len(pairs)
    return 1e6 * seal / done, 1e6 * opened / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--records", type=int, default=20000, help="records per figure")
    parser.add_argument("--size", type=int, default=150, help="plaintext bytes per record")
    args = parser.parse_args()
    server_ctx, client_ctx = contexts()
    for count in args.connections:
        pairs = [pair(server_ctx, client_ctx) for _ in range(count)]
        seal, opened = measure(pairs, args.records, args.size)
        print(f"{count:5} connections: seal {seal:.2f} us, open {opened:.2f} us per "
              f"{args.size}-byte record ({pairs[0][2].cipher()[0]})", flush=True)


if __name__ == "__main__":
    main()
