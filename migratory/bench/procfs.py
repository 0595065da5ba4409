"""Process limits and /proc readings for the benchmarks: fds, parent death, SIGTERM, CPU, RSS.

CPU figures are utime + stime from /proc/PID/stat and the machine totals from
/proc/stat; nothing here starts or talks to a process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies (prctl PDEATHSIG).

    So a benchmark killed with SIGKILL leaves no server or load process behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def handle_sigterm() -> None:
    """Turn SIGTERM into SystemExit in the benchmark process, so its cleanup still runs."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds; 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(b")") + 2 :].split()
    # After "pid (comm) ": field 3 is state, so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def system_jiffies() -> list[int]:
    """The first line of /proc/stat: user nice system idle iowait irq softirq steal (jiffies)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


class CpuMeter:
    """CPU % of named processes, and of the whole machine, between start() and stop().

    Process figures are utime + stime from /proc/PID/stat. The machine figures
    come from /proc/stat; ``softirq`` is where the kernel accounts most of the
    loopback TCP work (it is charged to no process), ``other`` is what remains
    for processes not named here (e.g. other jobs on a shared box).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}
        self._sys: list[int] = []
        self._t0 = 0.0
        self.result: dict[str, float] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._sys = system_jiffies()

    def add(self, name: str, pid: int, *, since_birth: bool = False) -> None:
        """Measure one more process from now on (or all its CPU, if it started after start())."""
        self.pids[name] = pid
        self._start[name] = 0.0 if since_birth else cpu_seconds(pid)

    def stop(self) -> dict[str, float]:
        wall = max(time.monotonic() - self._t0, 1e-9)
        now = system_jiffies()
        result = {
            name: 100.0 * (cpu_seconds(pid) - self._start[name]) / wall
            for name, pid in self.pids.items()
        }
        delta = [b - a for a, b in zip(self._sys, now, strict=True)]
        scale = 100.0 * (os.cpu_count() or 1) / max(sum(delta), 1)
        idle = delta[3] + delta[4]
        result["machine"] = scale * (sum(delta) - idle)
        result["softirq"] = scale * (delta[5] + delta[6])
        result["other"] = max(
            0.0, result["machine"] - result["softirq"] - sum(result[n] for n in self.pids)
        )
        result["wall_seconds"] = wall
        self.result = result
        return result


def machine_description() -> dict[str, str]:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) // 1024} MiB"
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "memory": mem,
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
    }


def pid_listening_on(port: int) -> int:
    """The PID of the process listening on TCP ``port`` on this machine, 0 if not found.

    Reads the listening sockets' inodes from /proc/net/tcp{,6}, then looks for a
    process holding one of them (only processes this user may inspect).
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{inode}]")
        except OSError:
            continue
    if not inodes:
        return 0
    holders: dict[int, int] = {}  # pid -> parent pid, of the processes holding one
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                        holders[int(entry)] = parent_pid(int(entry))
                        break
        except OSError:
            continue
    top = {pid: parent for pid, parent in holders.items() if parent not in holders}
    if len(top) > 1 and len(set(top.values())) == 1:
        return next(iter(top.values()))  # Workers > 1: the workers' supervisor
    return min(top) if top else 0


def parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    return int(stat[stat.rindex(b")") + 2 :].split()[1])
