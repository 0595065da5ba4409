"""``migratory cluster status``: each member's ``GET /cluster`` and ``GET /stats``, and
the table it prints from them.

Members are named ``migratory-N`` by their index in ``ClusterMembers`` (as StatefulSet
pods are), and so is the Raft leader: a member reports its leader by Raft address
(cluster port + 1), which the table maps back to the member's name.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# (name or None, client URL, cluster address or None, GET /cluster, GET /stats)
StatusRow = tuple[str | None, str, str | None, dict[str, Any], dict[str, Any]]

HEADER = ("member", "role", "ready", "raft", "leader", "clsn", "client URL", "")


def member_label(name: str | None, status: dict[str, Any], client_url: str) -> str:
    if name:
        return name
    index = status.get("index")
    return f"migratory-{index}" if isinstance(index, int) else client_url


def raft_address_of(cluster_address: str) -> str:
    """A seed runs Raft on its cluster port + 1."""
    host, _, port = cluster_address.rpartition(":")
    return f"{host}:{int(port) + 1}"


def leader_names(rows: Sequence[StatusRow]) -> dict[str, str]:
    """Raft address -> member name, from the state file's cluster addresses and from what
    the members themselves report."""
    names: dict[str, str] = {}
    for name, client_url, cluster_address, status, _ in rows:
        label = member_label(name, status, client_url)
        for address in (cluster_address, status.get("member")):
            if isinstance(address, str) and ":" in address:
                try:
                    names[raft_address_of(address)] = label
                except ValueError:
                    continue
        if isinstance(status.get("raft_address"), str):
            names[status["raft_address"]] = label
    return names


def _detail(status: dict[str, Any], stats: dict[str, Any]) -> str:
    reason = status.get("not_ready_reason")
    if status.get("ready") is False or reason:
        return f"not ready: {reason or 'no reason given'}"
    if "subjects" in stats:
        return f"{stats['subjects']} subjects, {stats.get('messages_published', 0)} messages"
    return ""


def status_cells(row: StatusRow, leaders: dict[str, str]) -> tuple[str, ...]:
    name, client_url, _, status, stats = row
    label = member_label(name, status, client_url)
    if "error" in status:  # (no answer: DOWN; an answer but not a member's: ?)
        role = "?" if "http_status" in status else "DOWN"
        return (label, role, "-", "-", "-", "-", client_url, f"({status['error']})")
    leader = status.get("raft_leader")
    ready = status.get("ready")
    return (
        label,
        str(status.get("role", "?")),
        "yes" if ready is True else "no" if ready is False else "?",
        str(status.get("raft_state") or "-"),
        "-" if not leader else leaders.get(str(leader), str(leader)),
        str(status.get("applied_clsn", "-")),
        client_url,
        _detail(status, stats),
    )


def format_status_table(rows: Iterable[StatusRow]) -> list[str]:
    rows = list(rows)
    leaders = leader_names(rows)
    table = [HEADER] + [status_cells(row, leaders) for row in rows]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(HEADER) - 1)]
    lines = []
    for cells in table:
        head = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)]
        head[5] = cells[5].rjust(widths[5])  # clsn, a number
        lines.append(("  ".join(head) + "  " + cells[-1]).rstrip())
    return lines


def fetch_json(http_url: str, path: str, timeout: float = 2.0) -> dict[str, Any]:
    """The answer, or ``{"error": why}`` (with ``http_status`` when the server answered:
    a single server's ``/cluster`` is 404 'not a cluster member')."""
    try:
        with urllib.request.urlopen(f"{http_url}{path}", timeout=timeout) as reply:
            status: dict[str, Any] = json.loads(reply.read())
            return status
    except urllib.error.HTTPError as exc:
        body = exc.read(200).decode(errors="replace").strip()
        return {"error": f"HTTP {exc.code}: {body or exc.reason}", "http_status": exc.code}
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return {"error": str(exc)}


def fetch_status(http_url: str, timeout: float = 2.0) -> dict[str, Any]:
    return fetch_json(http_url, "/cluster", timeout)


def read_state(path: Path) -> list[dict[str, Any]]:
    """The members ``cluster up`` recorded (the fields of :class:`LocalMember`)."""
    members: list[dict[str, Any]] = json.loads(path.read_text())
    return members


def run_status(args: argparse.Namespace) -> int:
    targets: list[tuple[str | None, str, str | None]]  # name, client URL, cluster address
    if args.server:
        targets = [(None, url, None) for url in args.server]
    else:
        try:
            members = read_state(Path(args.state))
        except (OSError, ValueError):
            print(f"no cluster state file {args.state!r}: is `migratory cluster up` running? "
                  "(or pass --server URL ...)", file=sys.stderr)
            return 2
        targets = [(m["name"], m["client_url"], m["cluster_address"]) for m in members]
    rows = []
    for name, client_url, cluster_address in targets:
        http_url = client_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        status = fetch_status(http_url)
        stats = fetch_json(http_url, "/stats") if "error" not in status else {}
        rows.append((name, client_url, cluster_address, status, stats))
    for line in format_status_table(rows):
        print(line)
    # 0: every member answered and is ready; 1: not so (a script's `status && ...`)
    return 0 if all(row[3].get("ready") is True for row in rows) else 1


def member_url(text: str) -> str:
    """``--server``: a member's client URL (``ws://``, ``wss://``, ``http://``, ``https://``
    and a host); ``127.0.0.1:8800`` alone is refused here, not shown DOWN with urllib's
    'unknown url type'."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("ws", "wss", "http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected a member's client URL such as ws://127.0.0.1:8800, got {text!r}")
    return text
