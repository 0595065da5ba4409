"""A local stand-in for the parts of Kubernetes a StatefulSet rehearsal needs.

Run inside a private network namespace (``unshare --net``): a bridge stands for the
pod network (10.244.0.0/24, this process at .1), each pod is a :class:`PodProcess`
in its own namespaces with a veth on the bridge and a new IP each time it is
created, ``/etc/hosts`` of every pod lists every existing pod under the headless
service's names (``publishNotReadyAddresses``), a kubelet loop runs the readiness
and liveness probes from the manifest, and a TCP proxy on 10.244.0.1:80 stands for
the client Service (ready pods only). Deleting a pod does what the kubelet does:
out of the Service, the ``preStop`` hook, SIGTERM, SIGKILL after the grace period.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio
from k8s_manifests import MONITOR_PORT, ROOT, Document, find, generated_secrets, pod_view
from kubelet_probes import ProbeState
from pod_fork import PodZygotes
from pod_network import GATEWAY, SUBNET, attach, make_network
from pod_sandbox import PodProcess, bytecode_cache
from zygote_process import MemberProcess

__all__ = ["CLUSTER_DNS_CACHE", "GATEWAY", "LEADER_PORT", "SERVICE_PORT", "LocalStatefulSet",
           "Pod", "http_body", "raft_sockets"]

SERVICE_PORT = 80
LEADER_PORT = 81
"""A second port at the client Service's address that sends each connection to the Raft
leader's pod when it is ready (any ready pod otherwise): the plays pin a subscriber to
the member they restart as the leader (tests/deploy/scaling_faults.py), so that a move
is always there to check, whichever pods the Service happened to pick."""


CLUSTER_DNS_CACHE = 30.0
"""Seconds CoreDNS's usual ``cache 30`` may answer a recreated pod's name with its old
IP (README, "Not tried on a real cluster"): a play's ``dns_cache``, scaled."""


@dataclass
class Pod:
    ordinal: int
    name: str
    ip: str
    process: PodProcess
    ready: bool = False
    started: bool = False  # the startup probe passed
    deleting: bool = False
    liveness_failures: int = 0
    liveness_due: float = 0.0  # when the kubelet next runs the liveness probe
    readiness: ProbeState | None = None  # the kubelet's count for the readiness probe
    may_exit: bool = False  # a play's pod that must stop at start (a bad config)
    probed: bool = False  # the kubelet runs its probes


@dataclass
class Events:
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.log.append(f"{trio.current_time():8.2f} {text}")
        print(self.log[-1], flush=True)


class LocalStatefulSet:
    def __init__(
        self, docs: list[Document], root: Path, password: str, *, time_scale: float = 1.0
    ) -> None:
        self.docs = docs
        self.root = root
        self.secrets = generated_secrets(password)
        self.time_scale = time_scale
        sts = find(docs, "StatefulSet")
        self.spec = sts["spec"]["template"]["spec"]
        self.container = self.spec["containers"][0]
        self.pods: dict[int, Pod] = {}
        self.dns_cache = 0.0
        """Seconds a cluster DNS cache may keep answering a name as it stood before it
        changed (CoreDNS's ``cache 30``): 0, every pod sees each change at once."""
        self._records: dict[str, list[tuple[float, str | None]]] = {}  # name: (since, ip)
        self.events = Events()
        self._next_ip = 10
        self._generation = 0
        self._creating: dict[int, trio.Event] = {}
        self._bin = Path(sys.executable).parent
        self._bytecode = bytecode_cache(self._bin, [ROOT / "migratory", ROOT / "cluster"])
        self._zygotes = PodZygotes()
        """Where the pods' members are forked from (pod_fork.py), unless exec'd."""

    # --- the pod network ----------------------------------------------------------

    @staticmethod
    def make_network() -> None:
        make_network()

    def hosts(self, pod: Pod | None = None) -> str:
        """Cluster DNS as /etc/hosts: every existing pod under the headless names, as
        ``pod`` sees them: with ``dns_cache``, a name as it stood that long ago when it
        changed since (the worst a cache does), or as it first was when it is younger (a
        cache that got it then still holds it); its own name always as it is. (A name
        younger than the cache was answered as it is now: a play's stale answers then
        depended on how long the pods' first start had taken before its fault.)"""
        subdomain = find(self.docs, "StatefulSet")["spec"]["serviceName"]
        lines = ["127.0.0.1 localhost"]
        then = trio.current_time() - self.dns_cache
        for name, history in sorted(self._records.items()):
            ip = history[-1][1]
            if pod is None or name != pod.name:
                ip = next((ip for since, ip in reversed(history) if since <= then),
                          history[0][1])
            if ip is not None:
                lines.append(f"{ip} {name}.{subdomain}.default.svc.cluster.local "
                             f"{name}.{subdomain} {name}")
        return "\n".join(lines) + "\n"

    def _record(self, name: str, ip: str | None) -> None:
        self._records.setdefault(name, []).append((trio.current_time(), ip))

    def _publish_dns(self) -> None:
        for pod in self.pods.values():
            text = self.hosts(pod)
            with (pod.process.pod_dir / "hosts").open("r+") as file:  # same inode: the
                if file.read() != text:  # bind mount in the pod sees the new records
                    file.seek(0)
                    file.truncate(0)
                    file.write(text)

    async def dns(self) -> None:
        """Cached records expiring: each pod's view brought up to date as time passes
        while a play has a ``dns_cache`` (and once after it goes back to 0). Without one
        a pod's view changes only when a pod is created or deleted, which publish it."""
        cached = 0.0
        while True:
            if self.dns_cache or cached:
                self._publish_dns()
            cached = self.dns_cache
            await trio.sleep(0.2)

    # --- pods -----------------------------------------------------------------------

    async def create(self, ordinal: int, *, ip: str | None = None) -> Pod:
        """Pod ``ordinal`` at a new IP, or at ``ip`` (one a deleted pod had: a CNI may
        hand an address out again while cluster DNS caches still name the old pod). Its
        process and network are made in a thread: done on this loop, a pod's ~10
        ``ip``/``nsenter`` commands held the Service's relays, the kubelet and the plays'
        SDK clients, which live on it, 0.1-0.5 s per pod at load ~25 (1.1 s for four).
        One creation per ordinal, as the controller makes it: a second ``create`` while
        the first runs in its thread (a play's restart and a scale both finding the
        ordinal missing) waits for that pod and returns it."""
        if (creating := self._creating.get(ordinal)) is not None:
            await creating.wait()
            return self.pods[ordinal]
        assert ordinal not in self.pods
        self._creating[ordinal] = trio.Event()
        try:
            return await self._create(ordinal, ip)
        finally:
            self._creating.pop(ordinal).set()

    async def _create(self, ordinal: int, ip: str | None) -> Pod:
        assert ip is None or all(p.ip != ip for p in self.pods.values()), ip
        view = pod_view(self.docs, ordinal, self.secrets)
        if ip is None:
            ip = f"{SUBNET}.{self._next_ip}"
            self._next_ip += 1
        self._generation += 1
        veth = f"v{ordinal}g{self._generation}"

        def start() -> PodProcess:
            process = PodProcess(view, pod_dir=self.root / view.name, bin_dir=self._bin,
                                 hosts="", held=True, bytecode=self._bytecode,
                                 zygotes=self._zygotes)
            try:
                attach(process.namespaces_pid, veth, ip)
            except BaseException:
                process.stop(timeout=1)
                raise
            return process

        process = await trio.to_thread.run_sync(start)
        assert ordinal not in self.pods
        pod = Pod(ordinal, view.name, ip, process)
        self.pods[ordinal] = pod
        self._record(pod.name, ip)
        self._publish_dns()
        process.release()
        self.events.note(f"created {pod.name} at {ip}")
        return pod

    async def delete(self, ordinal: int, *, delete_volume: bool = False,
                     grace: float | None = None) -> int | None:
        """Graceful deletion: out of the Service, preStop, SIGTERM, SIGKILL after the
        grace period (a violation: the drain must fit in it). ``grace``: seconds from
        the deletion to SIGKILL instead (``kubectl delete --grace-period``, a second
        deletion that shortens the first's): the preStop sleep is cut to it, and the
        kill it forces is no violation."""
        pod = self.pods[ordinal]
        pod.deleting, pod.ready = True, False
        started = trio.current_time()
        forced = grace is not None
        if grace is None:
            grace = float(self.spec.get("terminationGracePeriodSeconds", 30)) * self.time_scale
        pre_stop = self.container.get("lifecycle", {}).get("preStop", {})
        await trio.sleep(min(grace, float(pre_stop.get("sleep", {}).get("seconds", 0))
                             * self.time_scale))
        process = pod.process.proc
        process.terminate()
        remaining = max(0.1, started + grace - trio.current_time())
        code = await trio.to_thread.run_sync(_wait, process, remaining)
        if code is None:
            if not forced:
                self.events.violations.append(
                    f"{pod.name} needed SIGKILL after the grace period")
            process.kill()
            code = await trio.to_thread.run_sync(_wait, process, 10)
        if code != 0 and not forced:
            self.events.violations.append(f"{pod.name} exited {code} on SIGTERM")
        pod.process.stop()
        del self.pods[ordinal]
        self._record(pod.name, None)
        self._publish_dns()
        if delete_volume:
            for volume in pod.process.pod_dir.glob("volume-*"):
                shutil.rmtree(volume)
        self.events.note(f"deleted {pod.name} in {trio.current_time() - started:.1f} s"
                         f"{' with its volume' if delete_volume else ''}")
        return code

    @property
    def claims_deleted_when_scaled(self) -> bool:
        """The manifest's ``persistentVolumeClaimRetentionPolicy.whenScaled`` is Delete:
        the StatefulSet controller deletes the claims of the pods a scale-down removes
        (Kubernetes' default, Retain, keeps them for the ordinal's next pod)."""
        policy = find(self.docs, "StatefulSet")["spec"].get(
            "persistentVolumeClaimRetentionPolicy", {})
        return bool(policy.get("whenScaled", "Retain") == "Delete")

    async def scale(self, replicas: int) -> None:
        """``spec.replicas`` set (``kubectl scale``, the HPA, an apply that drops the
        field: the API's default, 1): with ``podManagementPolicy: Parallel`` the
        controller deletes every pod at or past ``replicas`` at once -- their claims with
        them as :attr:`claims_deleted_when_scaled` says -- and creates the missing ones
        below it at once."""
        async with trio.open_nursery() as deletions:
            for ordinal in sorted(self.pods, reverse=True):
                if ordinal >= replicas:
                    deletions.start_soon(partial(
                        self.delete, ordinal, delete_volume=self.claims_deleted_when_scaled))
        async with trio.open_nursery() as creations:
            for ordinal in range(replicas):
                if ordinal not in self.pods:
                    creations.start_soon(self.create, ordinal)

    def stop_all(self) -> None:
        """Every pod's process stopped at the end of a play: SIGTERM to all at once, then
        each waited for (one after another, each member's drain and exit took 0.3-0.5 s
        at load ~10 with no clients left: 1-3 s a play)."""
        pods = list(self.pods.values())
        for pod in pods:
            pod.deleting = True
            pod.process.terminate()
        for pod in pods:
            pod.process.stop(timeout=10)
        self.pods.clear()
        self._zygotes.close()

    async def wait_ready(self, ordinals: list[int] | range, timeout: float) -> None:
        with trio.move_on_after(timeout):
            while not all(o in self.pods and self.pods[o].ready for o in ordinals):
                await trio.sleep(0.1)
            self.events.note(f"ready: {[self.pods[o].name for o in ordinals]}")
            return
        states = [f"{p.name} ready={p.ready} {await http_body(p.ip, MONITOR_PORT, '/cluster')}"
                  for p in self.pods.values()]
        spy = Path(sys.executable).parent / "py-spy"
        for pod in self.pods.values():  # the threads of each member, when py-spy is there
            if spy.exists():
                dump = subprocess.run([str(spy), "dump", "--pid", str(pod.process.pid)],
                                      capture_output=True, text=True, timeout=30)
                (pod.process.pod_dir / "py-spy.txt").write_text(dump.stdout + dump.stderr)
        raise TimeoutError(f"pods {list(ordinals)} not ready in {timeout} s:\n" +
                           "\n".join(states))

    # --- the kubelet's probes and the client Service ----------------------------------

    async def kubelet(self) -> None:
        """The probes of each pod, on its own schedule from its creation, as the kubelet
        runs a worker per container's probe: one loop asking every pod in turn, then
        sleeping the period, made each pod's period the period plus every other pod's
        answers (1-7 pods, up to three probes each, answered on loaded event loops),
        and a pod that answered late held the others' probes."""
        async with trio.open_nursery() as workers:
            while True:
                for pod in list(self.pods.values()):
                    if not pod.probed:
                        pod.probed = True
                        workers.start_soon(self._probes, pod)
                await trio.sleep(0.05)

    async def _probes(self, pod: Pod) -> None:
        """Pod ``pod``'s probes until it is deleted or exits: startup, then readiness,
        every readiness period, liveness every liveness period from the startup probe's
        pass (as the manifest says: it was every readiness period, five times as often,
        each a request to the member and an answer the play's loop read)."""
        period = float(self.container["readinessProbe"].get("periodSeconds", 10)
                       ) * self.time_scale
        while not pod.deleting and self.pods.get(pod.ordinal) is pod:
            if pod.process.proc.poll() is not None:
                code = pod.process.proc.returncode
                if pod.may_exit:  # (what the kubelet then does is the play's)
                    self.events.note(f"{pod.name} exited on its own ({code})")
                else:
                    self.events.violations.append(f"{pod.name} exited on its own ({code})")
                pod.deleting, pod.ready = True, False
                return
            await self._probe(pod)
            await trio.sleep(period)

    def _port(self, probe: Document) -> int:
        port = probe["httpGet"]["port"]
        if isinstance(port, int):
            return port
        return int(next(p["containerPort"] for p in self.container["ports"]
                        if p["name"] == port))

    async def _get(self, pod: Pod, kind: str) -> int:
        return await self.probe(pod, kind)

    async def probe(self, pod: Pod, kind: str, *, timeout: float | None = None) -> int:
        """The status ``pod`` answers the manifest's probe ``kind`` with (0: none), within
        ``timeout`` (the probe's own ``timeoutSeconds`` without one)."""
        probe = self.container[kind]
        if timeout is not None:
            probe = {**probe, "timeoutSeconds": timeout}
        return await http_status(pod.ip, self._port(probe), probe)

    async def _probe(self, pod: Pod) -> None:
        if not pod.started:
            pod.started = await self._get(pod, "startupProbe") == 200
            if not pod.started:
                return
        was_ready = pod.ready
        if pod.readiness is None:
            pod.readiness = ProbeState.of(self.container["readinessProbe"])
        answered = await self._get(pod, "readinessProbe") == 200
        pod.ready = pod.readiness.observe(answered) and not pod.deleting
        if pod.ready != was_ready:
            self.events.note(f"{pod.name} {'ready' if pod.ready else 'not ready'}")
            if not pod.ready:  # what it is connected to: shown when the rehearsal fails
                sockets = await trio.to_thread.run_sync(raft_sockets, pod)
                self.events.note(f"{pod.name} Raft connections: {sockets}")
        if trio.current_time() >= pod.liveness_due:
            await self._liveness(pod)

    async def _liveness(self, pod: Pod) -> None:
        probe = self.container["livenessProbe"]
        pod.liveness_due = trio.current_time() + float(
            probe.get("periodSeconds", 10)) * self.time_scale
        if await self._get(pod, "livenessProbe") != 200:
            pod.liveness_failures += 1
            if pod.liveness_failures >= probe.get("failureThreshold", 3):
                self.events.violations.append(f"{pod.name} failed its liveness probe")
        else:
            pod.liveness_failures = 0

    async def service(
        self, *, port: int = SERVICE_PORT, prefer: Callable[[], int | None] | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The client Service on ``port``: each connection to a random ready pod; with
        ``prefer``, to the pod whose ordinal it names when that pod is ready."""
        pod_port = self.container["ports"][0]["containerPort"]

        async def forward(client: trio.SocketStream) -> None:
            ready = [p for p in self.pods.values() if p.ready]
            preferred = None if prefer is None else prefer()
            if preferred in self.pods and self.pods[preferred].ready:
                ready = [self.pods[preferred]]
            if not ready:
                await client.aclose()
                return
            target = random.choice(ready)
            if prefer is not None:  # which pod a pinned client is on: in the play's events
                self.events.note(f"port {port}: a connection to {target.name}")
            try:
                upstream = await trio.open_tcp_stream(target.ip, pod_port)
            except OSError:
                await client.aclose()
                return
            relay = Relay()
            async with client, upstream, trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, upstream, nursery.cancel_scope, relay.up)
                nursery.start_soon(_pipe, upstream, client, nursery.cancel_scope, relay.down)
            if prefer is not None:  # where a pinned client's bytes stopped, and who closed
                self.events.note(f"port {port}: the connection to {target.name} ended: "
                                 f"{relay.describe()}")

        await trio.serve_tcp(forward, port, host=GATEWAY, task_status=task_status)


@dataclass
class Flow:
    """One direction of a connection through the Service: bytes relayed, when the last
    ones came, and how it ended (EOF, an error, or cancelled when the other one ended)."""

    name: str
    relayed: int = 0
    last: float | None = None
    end: str = "cancelled"

    def describe(self) -> str:
        last = "never" if self.last is None else f"last at {self.last:.2f}"
        return f"{self.name} {self.relayed} B ({last}), {self.end}"


@dataclass
class Relay:
    up: Flow = field(default_factory=lambda: Flow("to the pod"))
    down: Flow = field(default_factory=lambda: Flow("to the client"))

    def describe(self) -> str:
        return f"{self.up.describe()}; {self.down.describe()}"


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream,
                scope: trio.CancelScope, flow: Flow) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
            flow.relayed += len(data)
            flow.last = trio.current_time()
        flow.end = f"EOF at {trio.current_time():.2f}"
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        flow.end = f"{exc.__cause__ or exc!r} at {trio.current_time():.2f}"
    scope.cancel()


async def http_status(ip: str, port: int, probe: Document) -> int:
    """A kubelet httpGet probe: the status, 0 when nothing answers in time."""
    path = probe["httpGet"]["path"]
    with trio.move_on_after(float(probe.get("timeoutSeconds", 1))):
        try:
            stream = await trio.open_tcp_stream(ip, port)
            async with stream:
                await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {ip}\r\n\r\n".encode())
                head = await stream.receive_some(4096)
            return int(head.split(b" ", 2)[1])
        except (OSError, ValueError, IndexError, trio.BrokenResourceError):
            return 0
    return 0


async def http_body(ip: str, port: int, path: str) -> str:
    with trio.move_on_after(3):
        try:
            stream = await trio.open_tcp_stream(ip, port)
            async with stream:
                await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {ip}\r\n\r\n".encode())
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
            return data.partition(b"\r\n\r\n")[2].decode(errors="replace").strip()
        except (OSError, trio.BrokenResourceError):
            return "(no answer)"
    return "(timeout)"


def raft_sockets(pod: Pod) -> str:
    result = subprocess.run(
        ["nsenter", f"--net=/proc/{pod.process.pid}/ns/net", "--", "ss", "-Htn",
         "( sport = :9801 or dport = :9801 )"],
        capture_output=True, text=True, timeout=10,
    )
    # state, local address, peer address: a dial nobody answers shows as SYN-SENT
    return " | ".join(" ".join([line.split()[0], *line.split()[3:5]])
                      for line in result.stdout.splitlines())


def _wait(process: MemberProcess, timeout: float) -> int | None:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
