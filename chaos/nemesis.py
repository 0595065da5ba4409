"""The nemesis: applies the seeded schedule's faults to member processes and proxies.

Each step is written to the ``nemesis`` history table as it happens. A single fault
is skipped when its member is already faulted, or when it would fault more than a
minority of the seeds ((seeds - 1) // 2) at once. Scenarios (several steps on
several members, :mod:`chaos.scenarios`) hold their members for their whole course;
they are made of the nemesis' steps, and the runner hands them to it
(:func:`chaos.scenario_faults.run_scenario_fault`): this module imports none of them.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from chaos.history import History
from chaos.members import Member
from chaos.proxy import Proxy
from chaos.schedule import RESTARTS, Fault, member

STOP_WAIT = 40.0  # s a SIGTERMed member may take to drain and exit (DrainTime 30 s + 10)


class Nemesis:
    def __init__(
        self,
        *,
        schedule: list[Fault],
        members: list[Member],
        proxy_of: dict[int, list[Proxy]],
        seeds: int,
        status: Mapping[int, Mapping[str, Any]],
        history: History,
        say: Callable[[str], None],
        wait_ready: Callable[[list[int], float], Awaitable[bool]],
        scenarios: Callable[[Nemesis, Fault, float], Awaitable[None]],
    ) -> None:
        """``status`` is the sampler's latest ``/cluster`` view per member index (live);
        ``wait_ready`` waits for members' ``/readyz`` (restarting exited ones);
        ``scenarios`` runs a fault of several steps (a restart, a combination, a
        scenario: :func:`chaos.scenario_faults.run_scenario_fault`)."""
        self.schedule, self.members, self.proxy_of = schedule, members, proxy_of
        self.seeds, self.status, self.h = seeds, status, history
        self.say, self.wait_ready, self.scenarios = say, wait_ready, scenarios
        self.faulted: dict[int, str] = {}  # member index -> the fault it is under
        self.applied: dict[str, int] = {}  # fault kind -> times applied
        self.skipped: dict[str, int] = {}  # fault kind -> times skipped
        # (from, to, what): history times during which a majority of the seeds was lost
        self.majority_lost: list[tuple[float, float, str]] = []
        self.closing = False  # the run's duration is over: no fault starts any more
        self.scenarios_under_way = 0
        self.scenarios_waiting: list[Fault] = []  # for their members, in schedule order

    def record(self, fault: str, target: str, phase: str, detail: str = "") -> None:
        self.h.write("nemesis", fault=fault, target=target, phase=phase, detail=detail)
        self.say(f"nemesis {fault} {target} {phase} {detail}".rstrip())

    def current_leader(self, *, faulted_too: bool = False) -> int | None:
        """The member the last samples show as Raft leader (not faulted, unless
        ``faulted_too``: then any member still up and running)."""
        for i, st in sorted(self.status.items()):
            if st.get("raft_state") != "leader":
                continue
            if i not in self.faulted or (faulted_too and self.members[i].state == "up"):
                return i
        return None

    def leaders(self) -> set[int]:
        """Every member whose last sample shows it as Raft leader (two while a deposed
        leader has not noticed yet)."""
        return {i for i, st in self.status.items() if st.get("raft_state") == "leader"}

    def _free(self, i: int) -> bool:
        """Member i may take a single fault now: not faulted, and the minority rule."""
        if i in self.faulted:
            return False
        faulted_seeds = sum(1 for k in self.faulted if k < self.seeds)
        return i >= self.seeds or faulted_seeds < (self.seeds - 1) // 2

    def skip(self, f: Fault, why: str) -> None:
        self.skipped[f.fault] = self.skipped.get(f.fault, 0) + 1
        self.say(f"skip {f.fault} {f.target}: {why}")

    async def run(self, start: float) -> None:
        """Apply every fault at ``start + fault.at`` (trio time)."""
        async with trio.open_nursery() as nursery:
            for f in self.schedule:
                await trio.sleep_until(start + f.at)
                if self.closing:
                    return
                nursery.start_soon(self.apply, f, start)

    async def finish_scenarios(self, timeout: float) -> None:
        """The run's duration is over: start no fault, and wait (at most ``timeout`` s)
        for the scenarios under way to end whole -- their windows and restarts. On a busy
        box each scenario waits for the one before, so the last ones start late."""
        self.closing = True
        with trio.move_on_after(timeout):
            while self.scenarios_under_way:
                await trio.sleep(0.1)

    async def apply(self, f: Fault, start: float) -> None:
        if f.fault in RESTARTS:
            await self.scenarios(self, f, start)
            return
        if f.scenario:
            self.scenarios_under_way += 1
            try:
                await self.scenarios(self, f, start)
            finally:
                self.scenarios_under_way -= 1
            return
        if f.target == "leader":
            i = self.current_leader()
            if i is None:
                live = [k for k in range(self.seeds) if k not in self.faulted]
                i = live[0] if live else 0
            detail = f"leader {f.detail}".strip()
        else:
            i = int(f.target.rsplit("-", 1)[1])
            detail = f.detail
        if not self._free(i):
            # another member of the same role (seed / non-seed) takes it, else skipped
            role = range(self.seeds) if i < self.seeds else range(self.seeds, len(self.members))
            busy = i
            order = sorted(role, key=lambda k: (k - busy) % len(self.members))
            alt = next((k for k in order if self._free(k)), None)
            if f.target == "leader" or alt is None:
                why = self.faulted.get(i) or "a minority of the seeds is already faulted"
                self.skip(f, f"{member(i)} busy ({why})")
                return
            detail = f"{detail} (instead of {member(i)}, under {self.faulted[i]})".strip()
            i = alt
        m, name = self.members[i], member(i)
        self.faulted[i] = f.fault
        self.applied[f.fault] = self.applied.get(f.fault, 0) + 1
        try:
            await self._start_fault(f.fault, m, detail)
            if f.duration:
                await trio.sleep_until(start + f.end)
                await self._end_fault(f.fault, m, detail)
        except Exception as exc:
            self.say(f"fault {f.fault} on {name} failed: {type(exc).__name__}: {exc}")
        finally:
            if f.fault != "leave":
                self.faulted.pop(i, None)

    async def _start_fault(self, kind: str, m: Member, detail: str) -> None:
        proxies = self.proxy_of.get(m.index, [])
        if kind == "kill":
            await self.kill(m, detail)
        elif kind == "pause":
            self.pause(m, detail)
        elif kind == "leave":
            self.record("leave", m.name, "start", "graceful SIGTERM " + detail)
            m.signal(signal.SIGTERM)
            await trio.to_thread.run_sync(m.wait_exit, 10)
            m.state = "left"
            self.record("leave", m.name, "end", detail)
        elif kind in ("delay", "blackhole", "partition"):
            clients = "clients" in detail
            links = proxies[2:] if clients else proxies[:2]
            what = "client links" if clients else "cluster+raft links"
            if kind == "delay":
                ms = int(detail.split("ms", 1)[0] or 100)
                self.record("delay", m.name, "start", f"{ms}ms on {what}, both ways")
                for p in links:
                    p.set(delay=ms / 1000)
            elif kind == "blackhole":
                self.record("blackhole", m.name, "start", f"{what}, both ways")
                for p in links:
                    p.set(blackhole=True)
            else:
                self.record("partition", f"*->{m.name}", "start", f"{detail} ({what})")
                for p in links:
                    p.set(inbound_dropped=True)
        elif kind == "reset":
            self.record("reset", m.name, "start", "cluster+raft+client connections")
            n = sum(p.reset() for p in proxies)
            self.record("reset", m.name, "end", f"{n} connections reset")

    async def _end_fault(self, kind: str, m: Member, detail: str) -> None:
        if kind == "kill":
            self.restart(m, detail)
            await self.restarted([m], 30)
        elif kind == "pause":
            self.resume(m, detail)
        elif kind == "leave":
            await self.join(m)
        elif kind in ("delay", "blackhole", "partition"):
            target = f"*->{m.name}" if kind == "partition" else m.name
            for p in self.proxy_of.get(m.index, []):
                p.heal()
            self.record(kind, target, "end", detail)
            self.record("heal", target, "start", kind)
            self.record("heal", target, "end", kind)

    # --- steps shared with the scenarios ----------------------------------------------

    async def kill(self, m: Member, detail: str) -> None:
        self.record("kill", m.name, "start", detail)
        m.signal(signal.SIGKILL)
        await trio.to_thread.run_sync(m.wait_exit, 10)
        m.state = "killed"

    async def stop(self, m: Member, detail: str) -> None:
        """SIGTERM (the member drains, then exits), and wait for its exit (SIGKILL after
        :data:`STOP_WAIT` s); rows: stop start, stop end (how and when it exited)."""
        self.record("stop", m.name, "start", detail)
        sent = self.h.now()
        m.signal(signal.SIGTERM)
        clean = await trio.to_thread.run_sync(m.wait_exit, STOP_WAIT)
        code = m.process.returncode if m.process is not None else None
        took = f"{self.h.now() - sent:.2f}s"
        outcome = f"exited {code} after {took}" if clean else f"SIGKILLed after {took}"
        m.state = "stopped"
        self.record("stop", m.name, "end", f"{outcome}: {detail}")

    def restart(self, m: Member, detail: str, *, after: str = "kill") -> None:
        """Start a killed (or stopped: ``after``) member again (rows: kill (stop) end,
        restart start); see ``restarted``."""
        if after == "kill":
            self.record("kill", m.name, "end", detail)
        m.start()
        self.record("restart", m.name, "start", f"pid {m.process.pid if m.process else '?'}")

    async def restarted(self, ms: list[Member], timeout: float) -> bool:
        """Wait for restarted members to be ready; a ``restart end`` row each, as each
        becomes ready (or does not within ``timeout`` s)."""
        results: list[bool] = []

        async def one(m: Member) -> None:
            ok = await self.wait_ready([m.index], timeout)
            results.append(ok)
            outcome = "ready" if ok else f"NOT ready after {timeout:g} s"
            self.record("restart", m.name, "end", outcome)

        async with trio.open_nursery() as nursery:
            for m in ms:
                nursery.start_soon(one, m)
        return all(results)

    def pause(self, m: Member, detail: str) -> None:
        self.record("pause", m.name, "start", detail)
        m.signal(signal.SIGSTOP)
        m.state = "paused"

    def resume(self, m: Member, detail: str) -> None:
        m.signal(signal.SIGCONT)
        m.state = "up"
        self.record("pause", m.name, "end", detail)
        self.record("resume", m.name, "start", detail)
        self.record("resume", m.name, "end", detail)

    async def join(self, m: Member) -> None:
        m.start()
        self.record("join", m.name, "start", f"pid {m.process.pid if m.process else '?'}")
        ok = await self.wait_ready([m.index], 30)
        self.record("join", m.name, "end", "ready" if ok else "NOT ready after 30 s")
        self.faulted.pop(m.index, None)

    async def heal_all(self) -> None:
        """The final heal: every proxy healed, paused members resumed, exited ones started."""
        for i, ps in self.proxy_of.items():
            for p in ps:
                p.refuse(None)
                p.follow(None)
                if p.delay or p.blackhole or p.inbound_dropped:
                    p.heal()
                    self.record("heal", member(i), "start", "final heal")
                    self.record("heal", member(i), "end", "final heal")
        for m in self.members:
            if m.state == "paused":
                m.signal(signal.SIGCONT)
                m.state = "up"
                self.record("resume", m.name, "start", "final heal")
                self.record("resume", m.name, "end", "final heal")
            elif m.process is None or m.process.poll() is not None:
                m.start()
                kind = "join" if m.state == "left" else "restart"
                self.record(kind, m.name, "start", "final heal")
                self.record(kind, m.name, "end", "final heal")
        self.faulted.clear()
