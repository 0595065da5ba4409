"""``python -m chaos run ...`` and ``python -m chaos replay-schedule ...``."""

from __future__ import annotations

if __name__ == "__main__":  # (before the imports below: Ctrl-C during them is one line)
    from migratory import interrupted

    interrupted.exit_on_sigint("python -m chaos")

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from chaos.schedule import COMBOS, RESTARTS, SCENARIOS, Fault, generate, to_jsonl
from migratory.server.faults import KINDS as FAULT_KINDS

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smh]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def duration(text: str) -> float:
    """Seconds from ``"300"``, ``"300s"``, ``"5m"`` or ``"1h"`` (also ``"1.5m"``)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"duration must look like 90, 90s, 5m or 1h (not {text!r})"
        )
    return float(match[1]) * _UNIT_SECONDS[match[2]]


def compaction(text: str) -> tuple[int, int]:
    """``"2000:10"`` -> (2000, 10): Raft log compaction after that many entries or seconds."""
    entries, sep, seconds = text.partition(":")
    try:
        if sep and int(entries) >= 100 and int(seconds) >= 1:
            return int(entries), int(seconds)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"compaction must look like 2000:10 (>= 100 entries, >= 1 s), not {text!r}"
    )


def member_overrides(items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items as settings for every member; an unknown key or a
    malformed item ends the command with a message naming it (values and the keys the
    runner owns are checked by the runner: :func:`chaos.members.check_overrides`)."""
    from migratory.config import ConfigError, parse_set_options

    try:
        return parse_set_options(items)
    except ConfigError as exc:
        raise SystemExit(f"chaos run: {exc}") from exc


def read_schedule(path: Path) -> list[Fault]:
    try:
        lines = path.read_text().splitlines()
        return [Fault(**json.loads(line)) for line in lines if line.strip()]
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"--schedule {path}: {exc}") from exc


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number >= ``minimum`` (argparse: the option named in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def publish_rate(text: str) -> float:
    """``--rate``: publishes/s, more than 0 (-1 made the workload loop for ever, deaf to
    Ctrl-C and SIGTERM: its arrival times ran backwards)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def fault_kinds(text: str) -> str:
    kinds = [k.strip() for k in text.split(",")]
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"--fault takes distinct kinds among {', '.join(FAULT_KINDS)}, got {text!r}"
        )
    return ",".join(kinds)


def scenario_kinds(text: str) -> tuple[str, ...]:
    """``--scenario``: distinct scenario names, comma-separated."""
    kinds = tuple(k.strip() for k in text.split(","))
    known = (*SCENARIOS, *RESTARTS, *COMBOS)
    bad = [k for k in kinds if k not in known]
    if bad or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"--scenario takes distinct names among {', '.join(known)}, got {text!r}"
        )
    return kinds


def standard_refusals(args: argparse.Namespace) -> None:
    """What a Standard run cannot do, refused before anything starts: the Raft scenarios
    (no Raft), and the MQTT clients. Their checks (spark_analysis/mqtt.py) read each
    message's position from its acknowledgement as one cluster-wide numbering, which
    Standard has not (each member numbers its own); and docs/mqtt.md promises an MQTT
    session nothing definite in Standard beyond a resume elsewhere getting the snapshot:
    a forward gap while it is connected is not told to it (MQTT has no way to), so there
    is no rule to hold it to. The SSE streams are allowed: their events carry positions,
    and docs/http.md promises them what the native protocol has (never a silent gap)."""
    scenarios = [k for k in args.scenario if k not in RESTARTS]
    options = [name for name, n in (
        ("--mqtt-subscribers", args.mqtt_subscribers),
        ("--mqtt-publishers", args.mqtt_publishers)) if n]
    if options:
        options[-1] += (" (MQTT has no Standard rules: positions come from the acks, one "
                        "numbering per member; docs/chaos.md, 'Standard mode')")
    if scenarios:
        options.append(f"--scenario {','.join(scenarios)} (Raft; only {', '.join(RESTARTS)})")
    if options:
        raise SystemExit(f"chaos run: --delivery-mode standard: not with {'; '.join(options)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a cluster under a workload and a seeded nemesis")
    replay = sub.add_parser("replay-schedule", help="print the nemesis schedule of a seed")
    for p in (run, replay):
        p.add_argument("--seed", type=int, required=True)
        p.add_argument(
            "--duration",
            type=duration,
            required=True,
            help="length of the workload: seconds (90, 90s) or minutes/hours (5m, 1h)",
        )
        p.add_argument("--members", type=int, default=5)
        p.add_argument("--seeds", type=int, default=3, choices=(3, 5))
        p.add_argument(
            "--delivery-mode",
            choices=("guaranteed", "standard"),
            default="guaranteed",
            help="the members' ClusterDeliveryMode (standard: no Raft, members forward "
            "publications to each other; single faults only, no Raft scenarios; checked by "
            "spark_analysis against what Standard promises, docs/chaos.md)",
        )
        p.add_argument(
            "--no-proxy",
            action="store_true",
            help="no TCP proxies (and so no delay/blackhole/reset/partition)",
        )
        p.add_argument(
            "--scenario",
            type=scenario_kinds,
            default=(),
            metavar="NAME[,NAME...]",
            help="scenarios of these kinds only, in turn, the single faults kept around them "
            "(also in runs under 30 s); the only way to get whole-restart and "
            "rolling-restart, which the seeded rotation never has",
        )
    run.add_argument("--out", required=True, help="run directory")
    run.add_argument(
        "--schedule",
        type=Path,
        help="apply this schedule (JSON lines as printed by replay-schedule) instead of "
        "generating one from the seed",
    )
    run.add_argument(
        "--compaction",
        type=compaction,
        metavar="ENTRIES:SECONDS",
        help="members' Raft log compaction thresholds (default: chaos.runner.COMPACTION)",
    )
    run.add_argument(
        "--only",
        type=lambda text: tuple(k.strip() for k in text.split(",") if k.strip()),
        default=(),
        help="apply only these fault kinds of the schedule (comma-separated, e.g. sync-kill)",
    )
    run.add_argument(
        "--fault",
        type=fault_kinds,
        metavar="KIND[,KIND...]",
        help="server test fault switch, KIND drop, duplicate or reorder: the 20th message "
        "fanned out to a raw auditor, on every member process (MIGRATORY_TEST_FAULT="
        "KIND:20:a); several kinds: kind i hits auditor a<i> (KIND:20:a0,KIND:20:a1,...)",
    )
    run.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config setting for every member (repeatable), e.g. --set "
        "MaxCachedMessagesPerSubject=5 or --set SendPath=io_uring; the keys the runner sets "
        "itself (ports, cluster, password, data dir, compaction) are refused",
    )
    run.add_argument("--subjects", type=at_least(1), default=50)
    run.add_argument(
        "--rate", type=publish_rate, default=420.0,
        help="publishes/s offered, all publishers together",
    )
    run.add_argument("--publishers", type=at_least(0), default=4, help="SDK publishers")
    run.add_argument("--raw-publishers", type=at_least(0), default=4,
                     help="raw-protocol publishers")
    run.add_argument("--http-publishers", type=at_least(0), default=0, metavar="N",
                     help="HTTP publishers (POST /publish on keep-alive connections; default 0)")
    run.add_argument("--mqtt-publishers", type=at_least(0), default=0, metavar="N",
                     help="MQTT publishers (paho-mqtt, QoS 1, clean session; default 0)")
    run.add_argument("--subscribers", type=at_least(0), default=14, help="SDK subscribers")
    run.add_argument("--auditors", type=at_least(0), default=6, help="raw-protocol subscribers")
    run.add_argument(
        "--mqtt-subscribers",
        type=at_least(0),
        default=0,
        metavar="N",
        help="MQTT persistent sessions (paho-mqtt, clean session 0, QoS 1) subscribed to "
        "their plan's subjects on the members' MQTT listeners (default 0: none, and no "
        "ListenMqtt)",
    )
    run.add_argument(
        "--sse-subscribers",
        type=at_least(0),
        default=0,
        metavar="N",
        help="Server-Sent Events streams (GET /events of their plan's subjects, reconnected "
        "to the next member with Last-Event-ID as EventSource does; default 0: none, and "
        "the members keep their SseHeartbeatInterval)",
    )
    run.add_argument("--garbage", type=at_least(0), default=0, metavar="N",
                     help="N bystanders feeding every member malformed WebSocket, HTTP, "
                     "MQTT, cluster-link and Raft input while the workload runs (default 0; "
                     "chaos/garbage.py)")
    args = parser.parse_args(argv)
    if args.command == "replay-schedule":
        sys.stdout.write(
            to_jsonl(
                generate(
                    args.seed,
                    args.duration,
                    members=args.members,
                    seeds=args.seeds,
                    proxies=not args.no_proxy,
                    forced=args.scenario,
                    standard=args.delivery_mode == "standard",
                )
            )
        )
        return 0
    if args.scenario and args.schedule:
        raise SystemExit("chaos run: --scenario and --schedule: one or the other")
    if args.delivery_mode == "standard":
        standard_refusals(args)
    try:  # (a traceback from deep in the runner was all a bad --out gave)
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"chaos run: --out {args.out}: {exc.strerror}") from None
    from chaos.runner import run as run_chaos

    return run_chaos(
        seed=args.seed,
        duration=args.duration,
        out=Path(args.out),
        members=args.members,
        seeds=args.seeds,
        fault=args.fault,
        only=args.only,
        scenario=args.scenario,
        schedule=read_schedule(args.schedule) if args.schedule else None,
        **({"compaction": args.compaction} if args.compaction else {}),
        proxies=not args.no_proxy,
        standard=args.delivery_mode == "standard",
        settings=member_overrides(args.settings),
        subjects=args.subjects,
        rate=args.rate,
        publishers=args.publishers,
        raw_publishers=args.raw_publishers,
        subscribers=args.subscribers,
        auditors=args.auditors,
        mqtt_subscribers=args.mqtt_subscribers,
        sse_subscribers=args.sse_subscribers,
        http_publishers=args.http_publishers,
        mqtt_publishers=args.mqtt_publishers,
        garbage=args.garbage,
    )


if __name__ == "__main__":
    sys.exit(interrupted.run("python -m chaos", main))
