#!/usr/bin/env python3
"""Fan-out benchmark: one server, N WebSocket subscribers of one subject, one publisher.

Default load: 1000 subscribers of ``/bench/fanout``, 100-byte contents at 100
messages/s for 30 s, i.e. 100,000 deliveries/s and 3,000,000 in all. Target:
every delivery arrives, end-to-end latency p99 <= 50 ms.

    .venv/bin/python benchmarks/fanout.py [--duration 30] [--set BatchTime=20] [--json out.json]
    .venv/bin/python benchmarks/fanout.py --front-end mqtt [--tls]   # MQTT QoS 0 subscribers
    .venv/bin/python benchmarks/fanout.py --front-end sse [--tls]   # Server-Sent Events (https)

Many subjects (issue 13's shape): ``--subjects N`` puts subscriber i on subject i mod N
and the publisher goes round-robin over the N subjects, e.g. 10,000 subscribers each on
its own subject at 20,000 msg/s:

    .venv/bin/python benchmarks/fanout.py --subscribers 10000 --subjects 10000 --rate 20000

The report adds the server's longest event-loop stall inside the publishing window (its
``/stats`` keep the largest loop gap of each second: migratory/server/loop_gaps.py).

How it measures:

* The publisher (its own process, one raw WebSocket) stamps each content with
  ``@@TS`` + 19 digits of ``time.monotonic_ns()`` taken just before the send,
  on an absolute schedule (message i is due at t0 + i/rate, no drift).
* Subscriber processes (``--procs``) hold the subscriber sockets in one epoll
  each. After each ``recv`` they read the clock, find every stamp in the
  chunk with one compiled-regex scan and bucket ``now - stamp`` into a 0.1 ms
  histogram (plus the exact maximum). No CBOR decoding, no frame objects.
* Server CPU % comes from /proc/PID/stat (utime + stime) over the publishing
  window; the load processes' CPU is measured the same way and reported too.
* Each subscriber confirms ``SUBSCRIBE_ALLOW`` before the publisher starts;
  after the last publish the subscribers drain for at most ``--drain`` s.

The server runs as a subprocess (``python -m cluster serve``), its log goes to
``benchmarks/results/``; it is stopped by PID (SIGINT, then SIGKILL) at the end,
on errors and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections import Counter

from _fanout_publisher import publisher_main
from _fanout_report import report, summarise
from _fanout_stamp import STAMP_END, self_test
from _fanout_subscriber import subscriber_main
from _loadgen import (
    CpuMeter,
    ServerProcess,
    raise_nofile,
    receive,
    rss_kib,
    run_with_server,
    server_stats,
    split,
)
from _mqttraw import mqtt_subscriber_main
from _sse_subscriber import sse_subscriber_main

# --- the parent ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, server: ServerProcess, procs: list[mp.Process]) -> dict:
    ctx = mp.get_context("fork")
    lifetime = args.setup_timeout + args.duration * 2 + args.drain + 120
    sub_pipes = []
    target, port = subscriber_main, server.port
    extra: tuple[object, ...] = ()
    if args.front_end == "mqtt":  # with --tls: MQTT over TLS on ListenMqttEncrypted
        target, port = mqtt_subscriber_main, args.tls_port or server.mqtt_port
        extra = (args.ca_file,)
    elif args.front_end == "sse":  # with --tls: https on the ListenEncrypted port
        target, port, extra = sse_subscriber_main, args.tls_port or server.port, (args.ca_file,)
    for k, (first, count) in enumerate(split(args.subscribers, args.procs)):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(
            target=target,
            args=(
                child_end, server.host, port, first, count, args.setup_timeout, lifetime,
                args.subjects, *extra,
            ),
            name=f"subscribers-{k}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        procs.append(proc)
        sub_pipes.append(parent_end)
    pub_pipe, child_end = ctx.Pipe()
    pub = ctx.Process(
        target=publisher_main,
        args=(
            child_end, server.host, server.port, args.size, args.ack, args.setup_timeout,
            args.subjects,
        ),
        name="publisher",
        daemon=True,
    )
    pub.start()
    child_end.close()
    procs.append(pub)

    t_setup = time.monotonic()
    ready = receive(sub_pipes, "ready", args.setup_timeout + 30)
    (pub_ready,) = receive([pub_pipe], "ready", args.setup_timeout + 30)
    subscribed = sum(r[1] for r in ready)
    setup_failures: Counter[str] = Counter()
    for r in [*ready, pub_ready]:
        setup_failures.update(r[2])
    setup_seconds = time.monotonic() - t_setup
    print(
        f"setup: {subscribed}/{args.subscribers} subscribers confirmed SUBSCRIBE_ALLOW "
        f"in {setup_seconds:.1f} s; publisher {'ready' if pub_ready[1] else 'FAILED'}"
        + (f"; failures {dict(setup_failures)}" if setup_failures else ""),
        flush=True,
    )
    if not pub_ready[1]:
        raise RuntimeError(f"publisher could not connect: {pub_ready[2]}")

    pids = {"server": server.pid, "publisher": pub.pid or 0}
    pids.update({proc.name: proc.pid or 0 for proc in procs if proc is not pub})
    meter = CpuMeter(pids)
    figures: dict = {
        "subscribed": subscribed,
        "setup_failures": dict(setup_failures),
        "setup_seconds": setup_seconds,
        "rss_before": rss_kib(server.pid),
        "stats_before": server_stats(server.host, server.port) or {},
    }
    meter.start()
    window_start = time.monotonic()
    pub_pipe.send(("go", args.rate, args.duration, args.drain))
    print(
        f"publishing {args.rate:g} msg/s x {args.size} B for {args.duration:g} s "
        f"to {subscribed} subscribers ...",
        flush=True,
    )
    (done,) = receive([pub_pipe], "done", args.duration * 2 + args.drain + 60)
    figures["cpu"] = meter.stop()
    figures["window"] = (window_start, time.monotonic())
    figures["stats_after"] = server_stats(server.host, server.port) or {}
    figures["published"] = done[1]
    for pipe in sub_pipes:
        pipe.send(("finish", done[1]["sent"], args.drain))
    figures["results"] = [r[1] for r in receive(sub_pipes, "result", args.drain + 30)]
    figures["rss_after"] = rss_kib(server.pid)
    for proc in procs:
        proc.join(5)
    return summarise(args, figures)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument(
        "--subjects",
        type=int,
        default=1,
        help="subjects: subscriber i takes subject i mod N, the publisher goes round-robin "
        "(1: everyone on one subject; N = --subscribers: one subject each)",
    )
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second")
    parser.add_argument("--size", type=int, default=100, help="content bytes (>= 24)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of publishing")
    parser.add_argument("--procs", type=int, default=2, help="subscriber processes")
    parser.add_argument(
        "--drain",
        type=float,
        default=5.0,
        help="seconds to wait for stragglers after the last publish",
    )
    parser.add_argument("--setup-timeout", type=float, default=60.0)
    parser.add_argument(
        "--no-ack",
        dest="ack",
        action="store_false",
        help="publish without closures (no PUBLISH_OK, no ack latency)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="Key=Value",
        help="server setting, passed through to `migratory serve --set`",
    )
    parser.add_argument(
        "--front-end",
        choices=("native", "mqtt", "sse"),
        default="native",
        help="the subscribers' protocol: native WebSocket, MQTT 3.1.1 QoS 0 over TCP, or "
        "Server-Sent Events (GET /events) (raw sockets counting stamps, no decoding; the "
        "publisher stays native)",
    )
    parser.add_argument(
        "--tls", action="store_true",
        help="with --front-end sse or mqtt: subscribers over TLS on a ListenEncrypted "
        "(sse) or ListenMqttEncrypted (mqtt) listener (certificates made with trustme)",
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument(
        "--self-test", action="store_true", help="check the stamp scanner offline, then exit"
    )
    args = parser.parse_args(argv)
    if args.size < STAMP_END + 1:
        parser.error(f"--size must be at least {STAMP_END + 1}")
    if args.subscribers < 1 or args.procs < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--subscribers, --procs, --rate and --duration must be positive")
    if not 1 <= args.subjects <= args.subscribers:
        parser.error("--subjects must be between 1 and --subscribers")
    args.procs = min(args.procs, args.subscribers)
    if args.tls and args.front_end not in ("sse", "mqtt"):
        parser.error("--tls needs --front-end sse or mqtt (raw WebSocket subscribers are plain)")
    args.tls_port, args.ca_file = 0, None
    if args.tls:
        key = "ListenMqttEncrypted" if args.front_end == "mqtt" else "ListenEncrypted"
        args.tls_port, args.ca_file, tls_settings = tls_setup(key)
        args.set = [*args.set, *tls_settings]
    return args


def tls_setup(listen_key: str = "ListenEncrypted") -> tuple[int, str, list[str]]:
    """A CA and a localhost certificate (trustme), a free port: the server settings."""
    import socket
    import tempfile

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    folder = tempfile.mkdtemp(prefix="migratory-bench-tls-")
    ca_file, cert_file, key_file = (f"{folder}/{n}.pem" for n in ("ca", "cert", "key"))
    ca.cert_pem.write_to_path(ca_file)
    cert.private_key_pem.write_to_path(key_file)
    with open(cert_file, "wb") as out:
        for blob in cert.cert_chain_pems:
            out.write(blob.bytes())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = [f"{listen_key}=127.0.0.1:{port}", f"TlsCertificate={cert_file}",
                f"TlsKey={key_file}"]
    return port, ca_file, settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        self_test()
        return 0
    raise_nofile()
    settings = list(args.set)
    if args.front_end == "mqtt" and not any(s.startswith("ListenMqtt=") for s in settings):
        settings.append("ListenMqtt=127.0.0.1:0")
    return run_with_server(
        f"fanout-{args.front_end}" if args.front_end != "native" else "fanout",
        settings, lambda server, procs: run(args, server, procs), report, args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
