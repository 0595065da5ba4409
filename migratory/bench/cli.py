"""``migratory bench``: load patterns against any server URL, or a local server it starts.

    migratory bench fanout   [--subscribers 1000 --rate 100 --duration 30]
    migratory bench subjects [--subscribers 1000 --per-subject 1 --rate 1000]
    migratory bench ack      [--rate 1000 --duration 10]
    migratory bench idle     [--connections 10000 --hold 5]

``--url ws://HOST:PORT`` measures a running migratory server, ``--mqtt
mqtt://HOST:PORT`` an MQTT broker (or a migratory server's MQTT listener, with
``--url``); without either the bench starts a server on 127.0.0.1 (``--set
Key=Value`` configures it). ``--compare`` measures a local migratory, mosquitto
and nats-server (MQTT) in the same run. Results go to stdout as a table (with
the detailed report of each run before it), ``--json FILE`` and ``--plot
FILE.png``. Exit status: 0 every run passed (every message counted, and the
p99 target when one is set), 1 a run failed, 2 a run could not complete.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from migratory.bench import fanout, idle, swarm
from migratory.bench.brokers import Broker
from migratory.bench.fanout_report import report as fanout_report
from migratory.bench.loadgen import run_against
from migratory.bench.output import table, write_json, write_plot
from migratory.bench.procfs import raise_nofile
from migratory.bench.stamp import STAMP_END, self_test
from migratory.bench.swarm import SwarmUnavailable
from migratory.bench.target import Target, TargetError, target_from_url, with_mqtt_listener

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")
"""The first paragraph of this docstring, as --help shows it (no reST markup)."""
PATTERNS = ("fanout", "subjects", "ack", "idle")
NAMES = {"fanout": "fan-out", "subjects": "many-subjects", "ack": "publish-with-ack",
         "idle": "idle-connections"}
# per pattern: subscribers, rate (msg/s), duration (s)
DEFAULTS = {"fanout": (1000, 100.0, 30.0), "subjects": (1000, 1000.0, 10.0),
            "ack": (0, 1000.0, 10.0)}
COMPARED = ("mosquitto", "nats-server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", choices=PATTERNS, help="the load pattern")
    where = parser.add_argument_group("where the load goes")
    where.add_argument("--url", help="a running migratory server, ws://HOST:PORT")
    where.add_argument("--mqtt", metavar="URL",
                       help="an MQTT broker mqtt://HOST:PORT (with --url: its MQTT listener)")
    where.add_argument("--pid", type=int, default=0,
                       help="the server's PID on this machine (default: found by its port)")
    where.add_argument("--compare", action="store_true",
                       help="measure a local migratory, mosquitto and nats-server in one run")
    where.add_argument("--set", action="append", default=[], metavar="Key=Value",
                       help="setting of the local server (`migratory serve --set`)")
    load = parser.add_argument_group("message patterns (fanout, subjects, ack)")
    load.add_argument("--subscribers", type=int,
                      help="subscribers (default: 1000; ack: none)")
    load.add_argument("--subjects", type=int,
                      help="subjects: subscriber i takes subject i mod N, the publisher goes "
                      "round-robin (fanout: 1; subjects: one per subscriber)")
    load.add_argument("--per-subject", type=int, metavar="K",
                      help="subjects pattern: K subscribers per subject")
    load.add_argument("--rate", type=float, help="messages per second")
    load.add_argument("--size", type=int, default=100, help=f"content bytes (>= {STAMP_END + 1})")
    load.add_argument("--duration", type=float, help="seconds of publishing")
    load.add_argument("--drain", type=float, default=5.0,
                      help="seconds to wait for stragglers after the last publish")
    load.add_argument("--no-ack", dest="ack", action="store_false",
                      help="publish without acknowledgements (closures / QoS 1)")
    load.add_argument("--front-end", choices=("native", "mqtt", "sse"), default="native",
                      help="the subscribers' protocol (the publisher speaks the URL's)")
    load.add_argument("--publisher", choices=("native", "mqtt"), default="native",
                      help="the publisher's protocol on a migratory server (mqtt: its MQTT "
                      "listener, QoS 1 acknowledgements); brokers are always mqtt")
    load.add_argument("--tls", action="store_true",
                      help="local server: subscribers over TLS (wss://, https:// or mqtts://)")
    load.add_argument("--target-p99", type=float, metavar="MS",
                      help="fail the run if the p99 latency is above this")
    load.add_argument("--self-test", action="store_true",
                      help="check the stamp scanner offline, then exit")
    conns = parser.add_argument_group("idle connections")
    conns.add_argument("--connections", type=int, default=10_000, help="idle connections")
    conns.add_argument("--hold", type=float, default=5.0, help="seconds to hold them idle")
    conns.add_argument("--window", type=int, default=256, help="handshakes in flight per process")
    conns.add_argument("--ping-timeout", type=float, default=30.0,
                       help="seconds a ping may wait for its pong")
    conns.add_argument("--heartbeat", type=int, metavar="MS",
                       help="ask for a heartbeat in connect, as the SDKs do (2000)")
    out = parser.add_argument_group("load processes and output")
    out.add_argument("--procs", type=int, default=2, help="load processes")
    out.add_argument("--swarm", choices=("c", "python"),
                     help="the subscriber processes: the C swarm (default when it builds: "
                     "gcc, libssl-dev) or the Python ones")
    out.add_argument("--setup-timeout", type=float, metavar="S",
                     help="seconds connecting and subscribing may take (default: 60; idle: 120)")
    out.add_argument("--json", metavar="FILE", type=output_file,
                     help="write the results as JSON")
    out.add_argument("--plot", metavar="FILE.png", type=output_file,
                     help="plot the latency distribution (PNG)")
    out.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar (it is shown only when stderr is a terminal)")


def output_file(text: str) -> str:
    """``--json``, ``--plot``: a file in a directory that exists, checked before the run
    (a traceback after it was all an operator got for a mistyped directory)."""
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text!r}: no such directory {parent!r}")
    return text


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the pattern's defaults and reject what cannot run, naming the bad option."""
    args.tls_port, args.ca_file = 0, None
    if args.pattern == "idle":
        args.setup_timeout = args.setup_timeout or 120.0
        if args.connections < 1 or args.procs < 1 or args.window < 1:
            parser.error("--connections, --procs and --window must be positive")
        if args.mqtt or args.compare:
            parser.error("idle: native WebSocket sessions only (no --mqtt, no --compare)")
        args.procs = min(args.procs, args.connections)
        return
    subscribers, rate, duration = DEFAULTS[args.pattern]
    args.subscribers = subscribers if args.subscribers is None else args.subscribers
    args.rate = rate if args.rate is None else args.rate
    args.duration = duration if args.duration is None else args.duration
    args.setup_timeout = args.setup_timeout or 60.0
    if args.pattern == "ack":
        if args.subscribers:
            parser.error("ack: the publish-with-ack pattern has no subscribers")
        if not args.ack:
            parser.error("ack: --no-ack makes no sense here")
        args.subjects = args.subjects or 1
    elif args.subscribers < 1:
        parser.error("--subscribers must be positive")
    elif args.pattern == "fanout":
        args.subjects = args.subjects or 1
    elif args.per_subject:
        args.subjects = max(1, args.subscribers // args.per_subject)
    else:
        args.subjects = args.subjects or args.subscribers
    if args.size < STAMP_END + 1:
        parser.error(f"--size must be at least {STAMP_END + 1}")
    if args.procs < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--procs, --rate and --duration must be positive")
    if args.subscribers and not 1 <= args.subjects <= args.subscribers:
        parser.error("--subjects must be between 1 and --subscribers")
    args.procs = max(1, min(args.procs, args.subscribers or 1))
    choose_swarm(parser, args)
    if args.tls:
        if args.url or args.mqtt or args.compare:
            parser.error("--tls: only with a server the bench starts (no --url/--mqtt/--compare)")
        key = "ListenMqttEncrypted" if args.front_end == "mqtt" else "ListenEncrypted"
        args.tls_port, args.ca_file, tls_settings = tls_setup(key)
        args.set = [*args.set, *tls_settings]


def choose_swarm(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The C swarm when asked for, or by default when it builds; else the Python one."""
    args.swarm_binary = None
    if args.swarm == "python" or not args.subscribers:
        args.swarm = "python" if args.subscribers else None
        return
    try:
        args.swarm_binary = str(swarm.build())
    except (SwarmUnavailable, OSError, subprocess.SubprocessError) as exc:
        if args.swarm == "c":
            parser.error(f"--swarm c: {exc}")
        print(f"migratory bench: Python subscribers, the C swarm is unavailable: {exc}",
              file=sys.stderr)
        args.swarm = "python"
        return
    args.swarm = "c"


def tls_setup(listen_key: str = "ListenEncrypted") -> tuple[int, str, list[str]]:
    """A CA and a localhost certificate (trustme), a free port: the server settings."""
    import tempfile

    import trustme

    from migratory.bench.brokers import free_port

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    folder = tempfile.mkdtemp(prefix="migratory-bench-tls-")
    ca_file, cert_file, key_file = (f"{folder}/{n}.pem" for n in ("ca", "cert", "key"))
    ca.cert_pem.write_to_path(ca_file)
    cert.private_key_pem.write_to_path(key_file)
    with open(cert_file, "wb") as out:
        for blob in cert.cert_chain_pems:
            out.write(blob.bytes())
    port = free_port()
    settings = [f"{listen_key}=127.0.0.1:{port}", f"TlsCertificate={cert_file}",
                f"TlsKey={key_file}"]
    return port, ca_file, settings


def given_target(args: argparse.Namespace) -> Target | None:
    """The server named on the command line, or None for a local one."""
    if args.url:
        target = target_from_url(args.url, pid=args.pid)
        if target.protocol != "native":
            raise TargetError(f"--url {args.url}: use --mqtt for an MQTT broker")
        return with_mqtt_listener(target, args.mqtt) if args.mqtt else target
    if args.mqtt:
        args.front_end = "mqtt"
        return target_from_url(args.mqtt, pid=args.pid)
    return None


def run_one(args: argparse.Namespace, target: Target | None) -> dict[str, Any] | None:
    module = idle if args.pattern == "idle" else fanout
    args.pattern_name = NAMES[args.pattern]
    pattern_args = argparse.Namespace(**{**vars(args), "pattern": NAMES[args.pattern]})
    result = run_against(
        target,
        functools.partial(module.run, pattern_args),
        kind=f"bench-{args.pattern}",
        settings=args.set,
        mqtt="mqtt" in (args.front_end, args.publisher) and args.pattern != "idle",
    )
    if result is not None:
        (idle.report if args.pattern == "idle" else fanout_report)(result)
    return result


def run_compare(args: argparse.Namespace) -> list[dict[str, Any] | None]:
    """A local migratory, then each broker over MQTT, one after the other."""
    results = [run_one(args, None)]
    for name in COMPARED:
        broker = Broker(name)
        try:
            target = broker.start()
        except RuntimeError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            results.append(None)
            continue
        try:
            mqtt_args = argparse.Namespace(**{**vars(args), "front_end": "mqtt"})
            results.append(run_one(mqtt_args, target))
        finally:
            broker.stop()
    return results


def bench(args: argparse.Namespace) -> int:
    if args.self_test:
        self_test()
        return 0
    raise_nofile()
    try:
        results = run_compare(args) if args.compare else [run_one(args, given_target(args))]
    except TargetError as exc:
        print(f"migratory bench: {exc}", file=sys.stderr)
        return 2
    done = [r for r in results if r is not None]
    if done:
        print()
        print(table(done))
    try:
        if args.json:
            write_json(args.json, done)
        if args.plot and done:
            write_plot(args.plot, done)
    except OSError as exc:  # (the directory went, or is not writable)
        print(f"migratory bench: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"migratory bench: {exc}", file=sys.stderr)
        return 2
    if len(done) < len(results):
        return 2
    return 0 if all(r["pass"] for r in done) else 1


def add_bench_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``migratory bench`` as a subcommand of the ``migratory`` CLI."""
    parser = commands.add_parser(
        "bench", help="measure a server: fan-out, many subjects, publish acks, idle connections",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=functools.partial(_checked, parser))


def _checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    check(parser, args)
    return bench(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m migratory.bench`` and the scripts in benchmarks/."""
    parser = argparse.ArgumentParser(prog="migratory bench", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return _checked(parser, args)
