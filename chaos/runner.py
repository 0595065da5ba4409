"""The chaos runner: a Guaranteed (or Standard) cluster of member processes (optionally behind
in-process TCP proxies), a recorded workload, a seeded nemesis and a cluster sampler.

Every member process is started and stopped by this runner, by PID. The pieces:
``members`` (processes, ports, proxies), ``workload`` (publishers, subscribers,
auditors), ``nemesis`` (the faults), ``history`` (the JSON-lines writer).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import trio

from chaos.cpu import CpuMeter
from chaos.garbage import bystanders, garbage_ports
from chaos.history import History
from chaos.http_publisher import http_publisher
from chaos.members import (
    Member,
    base_port,
    build_members,
    fault_switch,
    http_json,
    mqtt_port,
    on_free_ports,
    stop_members,
)
from chaos.mqtt_publisher import mqtt_publisher
from chaos.mqtt_workload import mqtt_subscriber
from chaos.nemesis import Nemesis
from chaos.plan import PublisherPlan, SubscriberPlan, plan_workload
from chaos.raw_workload import raw_auditor, raw_publisher
from chaos.scenario_faults import run_scenario_fault
from chaos.schedule import RESTARTS, Fault, generate, member, to_jsonl
from chaos.sse_workload import HEARTBEAT, sse_subscriber, stall_after
from chaos.workload import Workload

# Raft log compaction early and often (entries, seconds), so that a short run restarts
# seeds that load a compacted log (pysyncobj compacts when either threshold is passed)
COMPACTION = (2000, 10)
SCENARIO_GRACE = 120.0  # s after the duration for the scenarios under way to end whole
DRAIN_SECONDS = 10.0  # the subscribers' drain after the final heal, at most
# ... and no longer than this without a delivery: a half-dead connection is found within
# PING_EVERY + PONG_TIMEOUT (3 s) and its subscriber reconnects in under 2.5 s more
DRAIN_QUIET = 5.0


class Runner:
    def __init__(
        self,
        *,
        seed: int,
        duration: float,
        out: Path,
        members: int = 5,
        seeds: int = 3,
        fault: str | None = None,
        only: tuple[str, ...] = (),
        scenario: tuple[str, ...] = (),
        schedule: list[Fault] | None = None,
        compaction: tuple[int, int] = COMPACTION,
        proxies: bool = True,
        standard: bool = False,
        settings: Mapping[str, str] | None = None,
        subjects: int = 50,
        rate: float = 420.0,
        publishers: int = 4,
        raw_publishers: int = 4,
        subscribers: int = 14,
        auditors: int = 6,
        mqtt_subscribers: int = 0,
        sse_subscribers: int = 0,
        http_publishers: int = 0,
        mqtt_publishers: int = 0,
        garbage: int = 0,
    ) -> None:
        if members < 3 or seeds not in (3, 5) or seeds > members:
            raise SystemExit("need --members >= 3 and --seeds 3 or 5 (<= members)")
        self.seed, self.duration, self.out = seed, duration, out
        self.n, self.seeds, self.fault, self.proxies = members, seeds, fault, proxies
        self.mode = "Standard" if standard else "Guaranteed"
        self.plan = plan_workload(
            seed,
            members=members,
            subjects=subjects,
            rate=rate,
            sdk_publishers=publishers,
            raw_publishers=raw_publishers,
            sdk_subscribers=subscribers,
            auditors=auditors,
            mqtt_subscribers=mqtt_subscribers,
            sse_subscribers=sse_subscribers,
            http_publishers=http_publishers,
            mqtt_publishers=mqtt_publishers,
        )
        self.garbage, self.garbage_counts = garbage, Counter[str]()
        self.cpu = CpuMeter()
        self.lag = 0.0  # the worst event-loop wake-up delay since the last progress line
        self.run_id = f"chaos-{seed}-{int(time.time())}"
        if schedule is None:
            schedule = generate(seed, duration, members=members, seeds=seeds, proxies=proxies,
                                forced=scenario, standard=standard)
        if standard and any(f.scenario and f.fault not in RESTARTS for f in schedule):
            raise SystemExit("chaos run: --delivery-mode standard: the schedule has Raft "
                             "scenarios")
        self.schedule = schedule
        if only:
            self.schedule = [f for f in self.schedule if f.fault in only]
        out.mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)
        env = os.environ.copy()
        env.pop("MIGRATORY_TEST_FAULT", None)
        # the Raft test switch (cluster/raft_votes.py) passes through from this
        # environment, so that a planted run is one the runner says it is
        self.raft_switch = env.get("MIGRATORY_TEST_RAFT") or None
        switch = fault_switch(fault)
        if switch is not None:
            if len(switch.split(",")) > auditors:
                raise SystemExit(f"--fault {fault} needs one raw auditor per kind (--auditors)")
            env["MIGRATORY_TEST_FAULT"] = switch
        self.overrides = dict(settings or {})
        self.base, (self.members, self.proxy_of, self.client_urls) = on_free_ports(
            lambda: base_port(members),
            lambda base: build_members(
                count=members, seeds=seeds, base=base, proxies=proxies, out=out, env=env,
                on_crash=self.record_crash, mqtt=mqtt_subscribers + mqtt_publishers > 0,
                mode=self.mode,
            ),
            {"ClusterLogCompactionEntries": str(compaction[0]),
             "ClusterLogCompactionTime": str(compaction[1]),
             # SSE clients' watchdog: a stream heard every second (--set may say otherwise)
             **({"SseHeartbeatInterval": str(HEARTBEAT)} if sse_subscribers else {})},
            self.overrides,
        )
        raft_ports = {
            int(self.members[i].settings["ClusterMemberListen"].rsplit(":", 1)[1]) + 1: member(i)
            for i in range(members)
        }
        self.raft_name = {f"127.0.0.1:{p}": n for p, n in raft_ports.items()}
        self.t0 = time.monotonic()
        self.h = History(out, self.run_id, self.t0)
        self.last_status: dict[int, dict[str, Any]] = {}
        self.workload = Workload(seed=seed, plan=self.plan, client_urls=self.client_urls,
                                 history=self.h, say=self.say, standard=standard)
        self.nemesis = Nemesis(
            schedule=self.schedule,
            members=self.members,
            proxy_of=self.proxy_of,
            seeds=seeds,
            status=self.last_status,
            history=self.h,
            say=self.say,
            wait_ready=self.wait_ready,
            scenarios=run_scenario_fault,
        )

    def say(self, text: str) -> None:
        print(f"[chaos {self.h.now():7.1f}s] {text}", flush=True)

    def record_crash(self, m: Member, status: int) -> None:
        """A member exited without the runner ending it: a ``crashes`` row (with the tail
        of its log) and a progress line. Called by the member, once per process."""
        tail = m.log_tail()
        pid = m.process.pid if m.process else None
        self.h.write("crashes", member=m.name, pid=pid, exit_status=status, log_tail=tail)
        self.h.flush()
        last = tail.splitlines()[-1] if tail else ""
        self.say(f"CRASH: {m.name} (pid {pid}) exited on its own, status {status}: {last}")

    async def watch_members(self) -> None:
        """Notice every member exit as it happens (``Member.check_exit`` reports crashes)."""
        while True:
            for m in self.members:
                m.check_exit()
            await trio.sleep(0.1)

    async def wait_ready(self, indexes: list[int], timeout: float) -> bool:
        """Wait for ``/readyz`` of the members; one that is not running (a crash, already
        recorded by ``check_exit``) is started again."""
        with trio.move_on_after(timeout):
            while True:
                codes = [
                    await trio.to_thread.run_sync(http_json, self.members[i].http_port, "/readyz")
                    for i in indexes
                ]
                if all(c == 200 for c, _ in codes):
                    return True
                for i in indexes:
                    m = self.members[i]
                    if m.process is not None and m.process.poll() is not None:
                        m.check_exit()
                        self.say(f"{m.name} exited with {m.process.returncode}; starting it again")
                        m.start()
                await trio.sleep(0.2)
        return False

    async def wait_caught_up(self, timeout: float) -> bool:
        """Every member at one ``applied_clsn`` (Standard: none to wait for)."""
        if self.mode == "Standard":
            return True
        with trio.move_on_after(timeout):
            while True:
                clsns = set()
                for m in self.members:
                    _, st = await trio.to_thread.run_sync(http_json, m.http_port, "/cluster")
                    clsns.add(st.get("applied_clsn") if isinstance(st, dict) else None)
                if len(clsns) == 1 and None not in clsns:
                    return True
                await trio.sleep(0.3)
        return False

    async def sampler(self) -> None:
        while True:
            start = trio.current_time()
            for m in self.members:
                _, st = await trio.to_thread.run_sync(http_json, m.http_port, "/cluster", 0.4)
                if isinstance(st, dict):
                    self.last_status[m.index] = st
                    leader = st.get("raft_leader")
                    self.h.write(
                        "cluster",
                        member=m.name,
                        up=True,
                        role=st.get("role"),
                        raft_state=st.get("raft_state"),
                        raft_leader=self.raft_name.get(str(leader), leader),
                        ready=bool(st.get("ready")),
                        applied_clsn=st.get("applied_clsn"),
                    )
                else:
                    self.last_status.pop(m.index, None)
                    self.h.write(
                        "cluster",
                        member=m.name,
                        up=False,
                        role="seed" if m.index < self.seeds else "non-seed",
                        raft_state=None,
                        raft_leader=None,
                        ready=False,
                        applied_clsn=None,
                    )
            await trio.sleep(max(0.0, start + 0.25 - trio.current_time()))

    # --- main --------------------------------------------------------------------------

    async def main(self) -> int:
        workload = self.workload
        (self.out / "schedule.jsonl").write_text(to_jsonl(self.schedule))
        self.say(
            f"seed {self.seed}: {len(self.schedule)} faults scheduled over {self.duration}s; "
            f"{self.n} {self.mode} members ({self.seeds} seeds), base port {self.base}, "
            f"proxies {'on' if self.proxies else 'off'}, fault switch {self.fault or 'off'}"
            + (f", RAFT TEST SWITCH {self.raft_switch}" if self.raft_switch else "")
            + "".join(f", {k} = {v}" for k, v in self.overrides.items())
        )
        async with trio.open_nursery() as outer:
            for ps in self.proxy_of.values():
                for p in ps:
                    await outer.start(p.serve)
            for m in self.members:
                m.start()
            outer.start_soon(self.watch_members)
            outer.start_soon(self.sampler)
            if not await self.wait_ready(list(range(self.n)), 60):
                self.say("cluster not ready after 60 s")
                outer.cancel_scope.cancel()
                return 3
            self.say("cluster ready")
            async with trio.open_nursery() as work:
                readies = []
                for spec in self.plan.subscribers:
                    ev = trio.Event()
                    if not spec.start_after:
                        readies.append(ev)
                    work.start_soon(self.subscriber, spec, ev)
                with trio.move_on_after(15):
                    for ev in readies:
                        await ev.wait()
                await trio.sleep(0.5)
                start = trio.current_time()
                workload.started = start
                for pub in self.plan.publishers:
                    work.start_soon(self.supervised, pub.name, self.publisher, pub)
                work.start_soon(self.progress)
                ports = garbage_ports(self.client_urls, self.members, self.seeds,
                                      raft=self.mode == "Guaranteed")
                work.start_soon(bystanders, self.garbage, self.seed, ports,
                                self.garbage_counts, lambda: workload.publishing)
                work.start_soon(self.loop_lag)
                async with trio.open_nursery() as faults:
                    faults.start_soon(self.nemesis.run, start)
                    await trio.sleep(self.duration)
                    await self.nemesis.finish_scenarios(SCENARIO_GRACE)
                    faults.cancel_scope.cancel()
                self.say("duration over: stopping publishers, healing")
                workload.publishing = False
                await trio.sleep(1.0)
                await self.nemesis.heal_all()
                ready = await self.wait_ready(list(range(self.n)), 60)
                caught = await self.wait_caught_up(15)
                self.say(f"after heal: ready={ready} caught_up={caught}; draining subscribers")
                await self.drain(workload)
                self.h.flush()
                workload.record_unsubscribed()
                work.cancel_scope.cancel()
            outer.cancel_scope.cancel()
        return 0

    async def drain(self, workload: Workload) -> None:
        """Let the subscribers drain: until each has seen every acknowledged message it is
        owed, at most :data:`DRAIN_SECONDS`, and no longer than :data:`DRAIN_QUIET` s
        without a delivery (what a resync skipped, or a raw auditor lost, never comes)."""
        deliveries, quiet_since = workload.stats["deliveries"], trio.current_time()
        with trio.move_on_after(DRAIN_SECONDS):
            while not workload.drained():
                await trio.sleep(0.2)
                if workload.stats["deliveries"] != deliveries:
                    deliveries, quiet_since = workload.stats["deliveries"], trio.current_time()
                elif trio.current_time() - quiet_since >= DRAIN_QUIET:
                    break
        self.say(f"drained={workload.drained()}")

    async def subscriber(self, spec: SubscriberPlan, ready: trio.Event) -> None:
        """One subscriber of the plan, started ``start_after`` s after publishing starts."""
        if spec.start_after:
            while self.workload.started is None:
                await trio.sleep(0.1)
            await trio.sleep_until(self.workload.started + spec.start_after)
        if spec.kind == "sdk":
            await self.supervised(spec.name, self.workload.sdk_subscriber, spec, ready)
        elif spec.kind == "mqtt":
            ports = [mqtt_port(url) for url in self.client_urls]
            await self.supervised(spec.name, mqtt_subscriber, self.workload, spec, ready, ports)
        elif spec.kind == "sse":
            ports = [int(url.rsplit(":", 1)[1]) for url in self.client_urls]
            heartbeat = float(self.members[0].settings.get("SseHeartbeatInterval", HEARTBEAT))
            await self.supervised(spec.name, sse_subscriber, self.workload, spec, ready, ports,
                                  stall_after(heartbeat))
        else:
            await raw_auditor(self.workload, spec, ready)

    async def publisher(self, spec: PublisherPlan) -> None:
        if spec.kind == "sdk":
            await self.workload.sdk_publisher(spec)
        elif spec.kind == "raw":
            await raw_publisher(self.workload, spec)
        elif spec.kind == "http":
            ports = [int(url.rsplit(":", 1)[1]) for url in self.client_urls]
            await http_publisher(self.workload, spec, ports)
        else:
            await mqtt_publisher(self.workload, spec, [mqtt_port(u) for u in self.client_urls])

    async def supervised(self, what: str, fn: Any, *args: Any) -> None:
        """Run a workload task; if the SDK ends it (e.g. a terminal close), log and restart."""
        for attempt in range(1, 51):
            try:
                await fn(*args)
                return
            except Exception as exc:
                self.say(f"{what} ended with {type(exc).__name__}: {exc}; restart #{attempt}")
                await trio.sleep(0.5)

    async def loop_lag(self) -> None:
        """How late this runner's own event loop wakes up (a 50 ms sleep, measured):
        ``lag`` is the worst since the last progress line. Late wake-ups with the runner's
        CPU low mean the machine, not the runner, is the bottleneck."""
        while True:
            before = trio.current_time()
            await trio.sleep(0.05)
            self.lag = max(self.lag, trio.current_time() - before - 0.05)

    async def progress(self) -> None:
        while True:
            await trio.sleep(5)
            self.h.flush()
            leader = self.nemesis.current_leader()
            stats = self.workload.stats
            pids = [m.process.pid for m in self.members if m.process is not None]
            cpu = self.cpu.sample(pids)
            self.say(
                f"publishes ok={stats['ok']} fail={stats['fail']} "
                f"info={stats['info']} deliveries={stats['deliveries']} "
                f"late={self.workload.late} loop-lag={self.lag * 1000:.0f}ms "
                f"leader={member(leader) if leader is not None else '?'} "
                f"faulted={sorted(member(i) for i in self.nemesis.faulted)} "
                f"cpu: runner {cpu['runner']:.0%} members {cpu['members']:.0%} "
                f"machine {cpu['machine']:.0%} (of one core)"
            )
            self.lag = 0.0

    def stop(self) -> None:
        """The final stop: crashes so far recorded, then every member ended by PID."""
        stop_members(self.members)

    def write_run(self, code: int, wall: float) -> None:
        info = {
            "run": self.run_id,
            "seed": self.seed,
            "duration": self.duration,
            "members": [
                {
                    "name": m.name,
                    "role": "seed" if m.index < self.seeds else "non-seed",
                    "client_url": self.client_urls[m.index],
                    "cluster_address": m.settings["ClusterMemberListen"],
                    "bind": m.settings.get("ClusterMemberBind"),
                }
                for m in self.members
            ],
            "seeds": self.seeds,
            "mode": self.mode,
            "proxies": self.proxies,
            "fault_switch": fault_switch(self.fault),
            "raft_switch": self.raft_switch,
            "settings": self.overrides,
            "subjects": list(self.plan.subjects),
            "publishers": [p.name for p in self.plan.publishers],
            "subscribers": [s.name for s in self.plan.subscribers],
            "workload": asdict(self.plan),
            "cpu": self.cpu.totals(),
            "arrivals_dropped_late": self.workload.late,
            "majority_loss": self.workload.majority_loss(self.nemesis.majority_lost),
            "schedule": [asdict(f) for f in self.schedule],
            "faults": {
                "scheduled": len(self.schedule),
                "applied": sum(self.nemesis.applied.values()),
                "skipped": sum(self.nemesis.skipped.values()),
                "applied_by_kind": dict(sorted(self.nemesis.applied.items())),
                "skipped_by_kind": dict(sorted(self.nemesis.skipped.items())),
            },
            "counts": self.h.counts,
            "garbage": dict(sorted(self.garbage_counts.items())),
            "exit_code": code,
            "wall_seconds": round(wall, 2),
        }
        (self.out / "run.json").write_text(json.dumps(info, indent=2) + "\n")


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM = Ctrl-C: hand it to the current SIGINT handler (trio's, during the run)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def run(**kwargs: Any) -> int:
    wall0 = time.monotonic()
    # Ctrl-C and SIGTERM stop the run cleanly (members stopped by PID), even when
    # started in the background with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    runner = Runner(**kwargs)
    code = 1
    try:
        code = trio.run(runner.main)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt) or (
            isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None
        )
        if not interrupted:
            raise
        print("\ninterrupted: stopping the cluster", file=sys.stderr)
        code = 130
    finally:
        runner.stop()
        runner.h.close()
        runner.write_run(code, time.monotonic() - wall0)
    nem = runner.nemesis
    for w in runner.workload.majority_loss(nem.majority_lost):
        print(
            f"[chaos] no seed majority {w['from']}-{w['to']} s ({w['what']}): "
            f"{w['invoked']} publishes invoked, {w['acknowledged_inside']} acknowledged "
            f"inside (must be 0)",
            flush=True,
        )
    print(
        f"[chaos] done in {time.monotonic() - wall0:.1f}s, exit {code}; faults applied "
        f"{sum(nem.applied.values())} of {len(runner.schedule)} scheduled "
        f"({sum(nem.skipped.values())} skipped); history in {runner.out}: {runner.h.counts}; "
        f"cpu {runner.cpu.totals()}",
        flush=True,
    )
    return code
