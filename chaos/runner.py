"""The chaos runner: a Guaranteed cluster of member processes (optionally behind
in-process TCP proxies), a recorded workload, a seeded nemesis and a cluster sampler.

Every member process is started and stopped by this runner, by PID.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import trio

from chaos import schema
from chaos.proxy import Proxy
from chaos.schedule import Fault, generate, member, to_jsonl
from cluster.tooling import member_settings, start_member

SUBJECTS = tuple(f"/chaos/s{i}" for i in range(4))
PASSWORD = "chaos-cluster-password"


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(members: int, rng: random.Random) -> int:
    for _ in range(200):
        base = rng.randrange(20_000, 40_000, 10)
        ports = [
            base + off + 10 * i + d
            for i in range(members)
            for off in (0, 1000, 2000, 3000)
            for d in (0, 1)
        ]
        if all(_free(p) for p in ports):
            return base
    raise RuntimeError("no free ports")


class History:
    def __init__(self, out: Path, run: str, t0: float) -> None:
        (out / "history").mkdir(parents=True, exist_ok=True)
        self.run, self.t0 = run, t0
        self.files: dict[str, TextIO] = {
            t: (out / "history" / f"{t}.jsonl").open("w") for t in schema.TABLES
        }
        self.counts = {t: 0 for t in schema.TABLES}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def write(self, table: str, **values: Any) -> None:
        values.setdefault("time", self.now())
        line = schema.record(table, run=self.run, **values)
        self.files[table].write(json.dumps(line) + "\n")
        self.counts[table] += 1

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class Member:
    def __init__(
        self,
        index: int,
        settings: dict[str, str],
        client_port: int,
        http_port: int,
        log: Path,
        env: dict[str, str],
    ) -> None:
        self.index, self.name = index, member(index)
        self.settings, self.client_port, self.http_port = settings, client_port, http_port
        self.log, self.env = log, env
        self.process: subprocess.Popen[bytes] | None = None
        self.state = "down"  # up | killed | paused | left | down

    def start(self) -> None:
        old = os.environ.copy()
        try:
            os.environ.clear()
            os.environ.update(self.env)
            self.process = start_member(self.settings, self.log)
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.state = "up"

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def wait_exit(self, timeout: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)


def http_json(port: int, path: str, timeout: float = 0.6) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null") if path == "/cluster" else None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None


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
        proxies: bool = True,
        publishers: int = 4,
        subscribers: int = 4,
        rate: float = 25.0,
    ) -> None:
        if members < 3 or seeds not in (3, 5) or seeds > members:
            raise SystemExit("need --members >= 3 and --seeds 3 or 5 (<= members)")
        self.seed, self.duration, self.out = seed, duration, out
        self.n, self.seeds, self.fault, self.proxies = members, seeds, fault, proxies
        self.n_pub, self.n_sub, self.rate = publishers, subscribers, rate
        self.rng = random.Random(seed)
        self.run_id = f"chaos-{seed}-{int(time.time())}"
        self.schedule = generate(seed, duration, members=members, seeds=seeds, proxies=proxies)
        out.mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)
        self.base = free_base_port(members, random.Random())
        env = os.environ.copy()
        env.pop("MIGRATORY_TEST_FAULT", None)
        if fault:
            env["MIGRATORY_TEST_FAULT"] = f"{fault}:20"
        self.members: list[Member] = []
        self.proxy_of: dict[int, list[Proxy]] = {}
        self.url_to_member: dict[str, str] = {}
        self.client_urls: list[str] = []
        for i in range(members):
            s = member_settings(
                i,
                members=members,
                seeds=seeds,
                mode="Guaranteed",
                base_port=self.base,
                password=PASSWORD,
                data_dir=out / "data",
            )
            client_port = self.base + 10 * i
            public = client_port
            if proxies:
                s["ClusterMemberBind"] = f"127.0.0.1:{self.base + 2000 + 10 * i}"
                public = self.base + 3000 + 10 * i
                cl = self.base + 1000 + 10 * i
                bind = self.base + 2000 + 10 * i
                self.proxy_of[i] = [
                    Proxy(f"{member(i)}/cluster", cl, bind),
                    Proxy(f"{member(i)}/raft", cl + 1, bind + 1),
                    Proxy(f"{member(i)}/client", public, client_port),
                ]
            url = f"ws://127.0.0.1:{public}"
            self.client_urls.append(url)
            self.url_to_member[url] = member(i)
            self.members.append(
                Member(i, s, client_port, client_port, out / "logs" / f"{member(i)}.log", env)
            )
        raft_ports = {
            int(self.members[i].settings["ClusterMemberListen"].rsplit(":", 1)[1]) + 1: member(i)
            for i in range(members)
        }
        self.raft_name = {f"127.0.0.1:{p}": n for p, n in raft_ports.items()}
        self.t0 = time.monotonic()
        self.h = History(out, self.run_id, self.t0)
        self.last_status: dict[int, dict[str, Any]] = {}
        self.acked: dict[str, set[str]] = {s: set() for s in SUBJECTS}
        self.seen: dict[str, set[str]] = {}
        self.stats = {"ok": 0, "fail": 0, "info": 0, "deliveries": 0}
        self.faulted: dict[int, str] = {}
        self.publishing = True

    # --- helpers -------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[chaos {self.h.now():7.1f}s] {text}", flush=True)

    def member_of(self, url: str | None) -> str | None:
        return self.url_to_member.get(url or "", url)

    def servers_for(self, prefer: int) -> list[str]:
        return [f"{100 if i == prefer else 10} {u}" for i, u in enumerate(self.client_urls)]

    def nemesis(self, fault: str, target: str, phase: str, detail: str = "") -> None:
        self.h.write("nemesis", fault=fault, target=target, phase=phase, detail=detail)
        self.say(f"nemesis {fault} {target} {phase} {detail}".rstrip())

    # --- cluster ---------------------------------------------------------------------

    async def wait_ready(self, indexes: list[int], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while True:
                codes = [
                    await trio.to_thread.run_sync(http_json, self.members[i].http_port, "/readyz")
                    for i in indexes
                ]
                if all(c == 200 for c, _ in codes):
                    return True
                for i in indexes:
                    p = self.members[i].process
                    if p is not None and p.poll() is not None:
                        self.say(f"{member(i)} exited with {p.returncode}; restarting")
                        self.members[i].start()
                await trio.sleep(0.2)
        return False

    async def wait_caught_up(self, timeout: float) -> bool:
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

    def current_leader(self) -> int | None:
        for i, st in self.last_status.items():
            if st.get("raft_state") == "leader" and i not in self.faulted:
                return i
        return None

    # --- nemesis ---------------------------------------------------------------------

    async def run_nemesis(self, start: float) -> None:
        async with trio.open_nursery() as nursery:
            for f in self.schedule:
                await trio.sleep_until(start + f.at)
                nursery.start_soon(self.apply, f, start)

    async def apply(self, f: Fault, start: float) -> None:
        if f.target == "leader":
            i = self.current_leader()
            if i is None:
                live = [k for k in range(self.seeds) if k not in self.faulted]
                i = live[0] if live else 0
            detail = f"leader {f.detail}".strip()
        else:
            i = int(f.target.rsplit("-", 1)[1])
            detail = f.detail
        if i in self.faulted:
            self.say(f"skip {f.fault} {member(i)}: already under {self.faulted[i]}")
            return
        if (
            i < self.seeds
            and sum(1 for k in self.faulted if k < self.seeds) >= (self.seeds - 1) // 2
        ):
            self.say(f"skip {f.fault} {member(i)}: a minority of seeds is already faulted")
            return
        m, name = self.members[i], member(i)
        self.faulted[i] = f.fault
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
            self.nemesis("kill", m.name, "start", detail)
            m.signal(signal.SIGKILL)
            await trio.to_thread.run_sync(m.wait_exit, 10)
            m.state = "killed"
        elif kind == "pause":
            self.nemesis("pause", m.name, "start", detail)
            m.signal(signal.SIGSTOP)
            m.state = "paused"
        elif kind == "leave":
            self.nemesis("leave", m.name, "start", "graceful SIGTERM " + detail)
            m.signal(signal.SIGTERM)
            await trio.to_thread.run_sync(m.wait_exit, 10)
            m.state = "left"
            self.nemesis("leave", m.name, "end", detail)
        elif kind == "delay":
            ms = int(detail.rstrip("ms") or 100)
            self.nemesis("delay", m.name, "start", f"{ms}ms on peers<->member cluster+raft links")
            for p in proxies[:2]:
                p.set(delay=ms / 1000)
        elif kind == "blackhole":
            self.nemesis("blackhole", m.name, "start", "cluster+raft links, both ways")
            for p in proxies[:2]:
                p.set(blackhole=True)
        elif kind == "partition":
            self.nemesis("partition", f"*->{m.name}", "start", detail)
            for p in proxies[:2]:
                p.set(inbound_dropped=True)
        elif kind == "reset":
            self.nemesis("reset", m.name, "start", "cluster+raft+client connections")
            n = sum(p.reset() for p in proxies)
            self.nemesis("reset", m.name, "end", f"{n} connections reset")

    async def _end_fault(self, kind: str, m: Member, detail: str) -> None:
        if kind == "kill":
            self.nemesis("kill", m.name, "end", detail)
            m.start()
            self.nemesis("restart", m.name, "start", f"pid {m.process.pid if m.process else '?'}")
            ok = await self.wait_ready([m.index], 30)
            self.nemesis("restart", m.name, "end", "ready" if ok else "NOT ready after 30 s")
        elif kind == "pause":
            m.signal(signal.SIGCONT)
            m.state = "up"
            self.nemesis("pause", m.name, "end", detail)
            self.nemesis("resume", m.name, "start", detail)
            self.nemesis("resume", m.name, "end", detail)
        elif kind == "leave":
            await self.join(m)
        elif kind in ("delay", "blackhole", "partition"):
            target = f"*->{m.name}" if kind == "partition" else m.name
            for p in self.proxy_of.get(m.index, []):
                p.heal()
            self.nemesis(kind, target, "end", detail)
            self.nemesis("heal", target, "start", kind)
            self.nemesis("heal", target, "end", kind)

    async def join(self, m: Member) -> None:
        m.start()
        self.nemesis("join", m.name, "start", f"pid {m.process.pid if m.process else '?'}")
        ok = await self.wait_ready([m.index], 30)
        self.nemesis("join", m.name, "end", "ready" if ok else "NOT ready after 30 s")
        self.faulted.pop(m.index, None)

    async def heal_all(self) -> None:
        for i, ps in self.proxy_of.items():
            for p in ps:
                if p.delay or p.blackhole or p.inbound_dropped:
                    p.heal()
                    self.nemesis("heal", member(i), "start", "final heal")
                    self.nemesis("heal", member(i), "end", "final heal")
        for m in self.members:
            if m.state == "paused":
                m.signal(signal.SIGCONT)
                m.state = "up"
                self.nemesis("resume", m.name, "start", "final heal")
                self.nemesis("resume", m.name, "end", "final heal")
            elif m.process is None or m.process.poll() is not None:
                m.start()
                kind = "join" if m.state == "left" else "restart"
                self.nemesis(kind, m.name, "start", "final heal")
                self.nemesis(kind, m.name, "end", "final heal")
        self.faulted.clear()

    # --- workload --------------------------------------------------------------------

    async def publisher(self, k: int) -> None:
        import migratory_client as mc

        name = f"p{k}"
        rng = random.Random(self.seed * 1000 + k)
        policy = mc.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, connect_timeout=2.0)
        async with mc.connect(
            self.servers_for(k % self.n),
            name=name,
            reconnect=policy,
            keepalive=mc.Keepalive(interval=1.0, timeout=2.0),
            rng=random.Random(rng.random()),
        ) as client:
            n = 0
            while self.publishing and n < 10_000_000:
                n += 1
                msg_id = f"{name}-{n}"
                subject = rng.choice(SUBJECTS)
                target = self.member_of(client.server)
                self.h.write(
                    "publishes",
                    publisher=name,
                    type="invoke",
                    msg_id=msg_id,
                    subject=subject,
                    member=target,
                )
                try:
                    r = await client.publish(
                        subject, f"{msg_id}|chaos".encode(), {"msg_id": msg_id}, timeout=5.0
                    )
                except mc.PublishOutcomeUnknown as exc:
                    self.stats["info"] += 1
                    self.h.write(
                        "publishes",
                        publisher=name,
                        type="info",
                        msg_id=msg_id,
                        subject=subject,
                        member=target,
                        reason=str(exc),
                    )
                except mc.NotConnectedError as exc:
                    self.stats["fail"] += 1
                    self.h.write(
                        "publishes",
                        publisher=name,
                        type="fail",
                        msg_id=msg_id,
                        subject=subject,
                        member=target,
                        reason=f"not sent: {exc}",
                    )
                else:
                    if r.ok and r.position is not None:
                        self.stats["ok"] += 1
                        self.acked[subject].add(msg_id)
                        self.h.write(
                            "publishes",
                            publisher=name,
                            type="ok",
                            msg_id=msg_id,
                            subject=subject,
                            member=target,
                            epoch=r.position.epoch,
                            seq=r.position.seq,
                        )
                    else:
                        self.stats["fail"] += 1
                        self.h.write(
                            "publishes",
                            publisher=name,
                            type="fail",
                            msg_id=msg_id,
                            subject=subject,
                            member=target,
                            reason=f"{r.status}: {r.reason}",
                        )
                await trio.sleep(rng.expovariate(self.rate / self.n_pub))

    @staticmethod
    def parse_id(content: bytes) -> str | None:
        text = content.decode("utf-8", "replace")
        head, sep, tail = text.partition("|")
        return head if sep and tail == "chaos" and head.startswith("p") else None

    async def sdk_subscriber(self, k: int, ready: trio.Event) -> None:
        import migratory_client as mc

        name = f"s{k}"
        self.seen.setdefault(name, set())
        policy = mc.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, connect_timeout=2.0)
        prefer = (k + 1) % self.n
        async with mc.connect(
            self.servers_for(prefer),
            name=name,
            reconnect=policy,
            keepalive=mc.Keepalive(interval=1.0, timeout=2.0),
            rng=random.Random(self.seed * 7919 + k),
        ) as client:

            async def notes() -> None:
                async for note in client.notifications():
                    pos = note.position
                    subjects = [note.subject] if note.subject else [None]
                    for s in subjects:
                        self.h.write(
                            "subscriptions",
                            subscriber=name,
                            kind="sdk",
                            subject=s,
                            event=str(note.status),
                            member=self.member_of(note.server or client.server),
                            epoch=pos.epoch if pos else None,
                            seq=pos.seq if pos else None,
                        )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(notes)
                async with client.subscribe(*SUBJECTS) as sub:
                    for s in SUBJECTS:
                        self.h.write(
                            "subscriptions",
                            subscriber=name,
                            kind="sdk",
                            subject=s,
                            event="subscribed",
                            member=None,
                        )
                    ready.set()
                    async for m in sub:
                        msg_id = self.parse_id(m.content)
                        self.stats["deliveries"] += 1
                        if msg_id:
                            self.seen[name].add(msg_id)
                        self.h.write(
                            "deliveries",
                            subscriber=name,
                            kind="sdk",
                            member=self.member_of(client.server),
                            subject=m.subject,
                            epoch=m.epoch,
                            seq=m.seq,
                            msg_id=msg_id,
                            type=str(m.type),
                        )
                nursery.cancel_scope.cancel()

    async def raw_auditor(self, k: int, ready: trio.Event) -> None:
        """Protocol-level subscriber: resume by last position seen, no dedupe, no gap repair."""
        from chaos.rawtrio import RawSession
        from migratory.protocol import ops

        name = f"a{k}"
        self.seen[name] = set()
        last: dict[str, tuple[int, int]] = {}
        idx = (self.n - 1 - k) % self.n
        attempts = 0
        while attempts < 100_000:
            attempts += 1
            url = self.client_urls[idx]
            mname = member(idx)
            port = int(url.rsplit(":", 1)[1])
            try:
                with trio.fail_after(3):
                    session = await RawSession.open(port, name)
            except Exception:  # refused, 1013 while syncing, paused member, ...
                idx = (idx + 1) % self.n
                await trio.sleep(0.1)
                continue
            self.h.write(
                "subscriptions",
                subscriber=name,
                kind="raw",
                subject=None,
                event="SERVER_UP",
                member=mname,
            )
            reason = "closed"
            try:
                async with session:
                    await session.subscribe([(s, last.get(s)) for s in SUBJECTS])
                    for s in SUBJECTS:
                        e, q = last.get(s, (None, None))
                        self.h.write(
                            "subscriptions",
                            subscriber=name,
                            kind="raw",
                            subject=s,
                            event="subscribed",
                            member=mname,
                            epoch=e,
                            seq=q,
                        )
                    ready.set()
                    async for op in session.ops(ping_every=1.0, pong_timeout=2.0):
                        if isinstance(op, ops.Deliver):
                            for m in op.messages:
                                msg_id = self.parse_id(m.content)
                                if msg_id:
                                    self.seen[name].add(msg_id)
                                last[m.subject] = (m.epoch, m.seq)
                                self.h.write(
                                    "deliveries",
                                    subscriber=name,
                                    kind="raw",
                                    member=mname,
                                    subject=m.subject,
                                    epoch=m.epoch,
                                    seq=m.seq,
                                    msg_id=msg_id,
                                    type=str(m.type),
                                )
                        elif isinstance(op, ops.SubjectStatus):
                            pos = op.position
                            if op.status.value == "DATA_RESYNC" and pos is not None:
                                last[op.subject] = (pos.epoch, pos.seq)
                            self.h.write(
                                "subscriptions",
                                subscriber=name,
                                kind="raw",
                                subject=op.subject,
                                event=op.status.value,
                                member=mname,
                                epoch=pos.epoch if pos else None,
                                seq=pos.seq if pos else None,
                            )
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            self.h.write(
                "subscriptions",
                subscriber=name,
                kind="raw",
                subject=None,
                event="SERVER_DOWN",
                member=mname,
            )
            self.say(f"auditor {name} lost {mname} ({reason[:80]})")
            idx = (idx + 1) % self.n
            await trio.sleep(0.1)

    # --- main --------------------------------------------------------------------------

    def drained(self) -> bool:
        want = set().union(*self.acked.values())
        return all(want <= seen for seen in self.seen.values())

    async def main(self) -> int:
        (self.out / "schedule.jsonl").write_text(to_jsonl(self.schedule))
        self.say(
            f"seed {self.seed}: {len(self.schedule)} faults scheduled over {self.duration}s; "
            f"{self.n} members ({self.seeds} seeds), base port {self.base}, "
            f"proxies {'on' if self.proxies else 'off'}, fault switch {self.fault or 'off'}"
        )
        async with trio.open_nursery() as outer:
            for ps in self.proxy_of.values():
                for p in ps:
                    await outer.start(p.serve)
            for m in self.members:
                m.start()
            outer.start_soon(self.sampler)
            if not await self.wait_ready(list(range(self.n)), 60):
                self.say("cluster not ready after 60 s")
                outer.cancel_scope.cancel()
                return 3
            self.say("cluster ready")
            async with trio.open_nursery() as work:
                readies = []
                for k in range(self.n_sub):
                    ev = trio.Event()
                    readies.append(ev)
                    work.start_soon(self.supervised, f"s{k}", self.sdk_subscriber, k, ev)
                for k in range(2):
                    ev = trio.Event()
                    readies.append(ev)
                    work.start_soon(self.raw_auditor, k, ev)
                with trio.move_on_after(15):
                    for ev in readies:
                        await ev.wait()
                await trio.sleep(0.5)
                for k in range(self.n_pub):
                    work.start_soon(self.supervised, f"p{k}", self.publisher, k)
                start = trio.current_time()
                self.nemesis_start = time.monotonic() - self.t0
                work.start_soon(self.progress)
                with trio.move_on_after(self.duration):
                    await self.run_nemesis(start)
                    await trio.sleep_forever()
                self.say("duration over: stopping publishers, healing")
                self.publishing = False
                await trio.sleep(1.0)
                await self.heal_all()
                ready = await self.wait_ready(list(range(self.n)), 60)
                caught = await self.wait_caught_up(15)
                self.say(f"after heal: ready={ready} caught_up={caught}; draining subscribers")
                with trio.move_on_after(10):
                    while not self.drained():
                        await trio.sleep(0.2)
                self.say(f"drained={self.drained()}")
                self.h.flush()
                for name in self.seen:
                    kind = "raw" if name.startswith("a") else "sdk"
                    for s in SUBJECTS:
                        self.h.write(
                            "subscriptions",
                            subscriber=name,
                            kind=kind,
                            subject=s,
                            event="unsubscribed",
                            member=None,
                        )
                work.cancel_scope.cancel()
            outer.cancel_scope.cancel()
        return 0

    async def supervised(self, what: str, fn: Any, *args: Any) -> None:
        """Run a workload task; if the SDK ends it (e.g. a terminal close), log and restart."""
        for attempt in range(1, 51):
            try:
                await fn(*args)
                return
            except Exception as exc:
                self.say(f"{what} ended with {type(exc).__name__}: {exc}; restart #{attempt}")
                await trio.sleep(0.5)

    async def progress(self) -> None:
        while True:
            await trio.sleep(5)
            self.h.flush()
            leader = self.current_leader()
            self.say(
                f"publishes ok={self.stats['ok']} fail={self.stats['fail']} "
                f"info={self.stats['info']} deliveries={self.stats['deliveries']} "
                f"leader={member(leader) if leader is not None else '?'} "
                f"faulted={sorted(member(i) for i in self.faulted)}"
            )

    def stop(self) -> None:
        for m in self.members:
            p = m.process
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for m in self.members:
            p = m.process
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

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
            "mode": "Guaranteed",
            "proxies": self.proxies,
            "fault_switch": f"{self.fault}:20" if self.fault else None,
            "subjects": list(SUBJECTS),
            "publishers": self.n_pub,
            "subscribers": self.n_sub,
            "auditors": 2,
            "schedule": [asdict(f) for f in self.schedule],
            "counts": self.h.counts,
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
    print(
        f"[chaos] done in {time.monotonic() - wall0:.1f}s, exit {code}; history in "
        f"{runner.out}: {runner.h.counts}",
        flush=True,
    )
    return code
