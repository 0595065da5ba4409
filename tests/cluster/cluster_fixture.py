"""Real member processes on 127.0.0.1 for cluster tests; every one stopped by PID."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from faulty_member import FAULTS_ENV
from zygote_process import MemberProcess, start_cluster_process

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import close_clients_of

from cluster.tooling import (
    free_base_port,
    member_command,
    member_settings,
    start_member,
    stop_all,
)


class LocalCluster:
    def __init__(
        self,
        tmp_path: Path,
        *,
        members: int,
        seeds: int = 3,
        mode: str = "Guaranteed",
        exec_members: bool = False,
        **extra: str,
    ) -> None:
        """``exec_members``: every member exec'd (``python -m cluster serve``), not forked
        from the tests' zygote (``tests/zygote.py``): for tests of a member's start-up."""
        self.tmp_path = tmp_path
        self.exec_members = exec_members
        self.members = members
        self.base = free_base_port(members)
        self.settings = [
            {
                **member_settings(
                    i,
                    members=members,
                    seeds=seeds,
                    mode=mode,
                    base_port=self.base,
                    password="test-cluster-password",
                    data_dir=tmp_path / "data",
                ),
                **extra,
            }
            for i in range(members)
        ]
        self.processes: list[MemberProcess | None] = [None] * members
        self.faults: dict[int, str] = {}
        """Member index -> handlers made to fail (``faulty_member.py``'s spec)."""

    def start(self, index: int) -> None:
        log_path = self.tmp_path / f"migratory-{index}.log"
        faults = self.faults.get(index)
        if faults is None and self.exec_members:
            self.processes[index] = start_member(self.settings[index], log_path)
            return
        args, env = member_command(self.settings[index])
        if faults is None:
            with log_path.open("ab") as log:
                self.processes[index] = start_cluster_process(
                    args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
            return
        assert args[1:4] == ["-m", "cluster", "serve"], args
        env[FAULTS_ENV] = faults
        with log_path.open("ab") as log:
            self.processes[index] = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("faulty_member.py")), *args[3:]],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
            )

    def start_all(self, indexes: range | list[int] | None = None) -> None:
        for i in indexes if indexes is not None else range(self.members):
            self.start(i)

    def url(self, index: int) -> str:
        return f"ws://{self.settings[index]['Listen']}"

    def http(self, index: int) -> str:
        return f"http://{self.settings[index]['Listen']}"

    def port(self, index: int) -> int:
        return int(self.settings[index]["Listen"].rsplit(":", 1)[1])

    def status(self, index: int) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http(index)}/cluster", timeout=2) as reply:
            result: dict[str, Any] = json.loads(reply.read())
            return result

    def ready(self, index: int) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http(index)}/readyz", timeout=2):
                return True
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, indexes: list[int] | range | None = None, timeout: float = 30) -> None:
        wanted = list(indexes if indexes is not None else range(self.members))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in wanted:
                process = self.processes[i]
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"member {i} exited:\n{self.log(i)}")
            if all(self.ready(i) for i in wanted):
                return
            time.sleep(0.1)
        raise TimeoutError(
            f"members {wanted} not ready:\n" + "\n".join(self.log(i)[-3000:] for i in wanted)
        )

    def wait_refused(self, index: int, reason: str, logged: str, timeout: float = 15) -> str:
        """Until member ``index`` is not ready with a reason that starts with ``reason``
        and a seed's log says ``logged`` (polled: a fixed sleep waited 2 s for both);
        returns the reason."""
        deadline = time.monotonic() + timeout
        said: str | None = None
        while True:
            try:
                said = self.status(index).get("not_ready_reason")
            except OSError:
                said = None
            seeds_say = "".join(self.log(i) for i in range(self.members) if i != index)
            if said is not None and said.startswith(reason) and logged in seeds_say:
                return said
            if time.monotonic() > deadline:
                raise TimeoutError(f"member {index}: {said!r}, not {reason!r} with {logged!r} "
                                   "in a seed's log")
            time.sleep(0.05)

    def leader(self) -> int:
        for i in range(self.members):
            try:
                if self.status(i).get("raft_state") == "leader":
                    return i
            except OSError:
                continue
        raise RuntimeError("no Raft leader")

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        process = self.processes[index]
        assert process is not None
        process.send_signal(sig)
        process.wait(10)

    def exited(self) -> dict[int, int]:
        """Members whose process has ended: index -> exit status (a member the test
        killed shows here too: compare with what it killed)."""
        return {
            i: code
            for i, process in enumerate(self.processes)
            if process is not None and (code := process.poll()) is not None
        }

    def wait_same_applied(self, indexes: list[int] | range, timeout: float = 20) -> int:
        """Until every member in ``indexes`` reports the same applied clsn; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            applied = {i: self.status(i)["applied_clsn"] for i in indexes}
            if len(set(applied.values())) == 1:
                return next(iter(applied.values()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"applied clsn differ: {applied}")
            time.sleep(0.2)

    def log(self, index: int) -> str:
        path = self.tmp_path / f"migratory-{index}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def ports(self) -> set[int]:
        """Every port the members' settings name (their listeners and links)."""
        return {int(port) for settings in self.settings for value in settings.values()
                for port in re.findall(r":(\d+)\b", str(value))}

    def stop(self) -> None:
        """Stops every member, the test's raw clients of them closed first: each one left
        open held its member's drain for the close linger (5 s)."""
        close_clients_of(self.ports())
        stop_all([p for p in self.processes if p is not None])
