"""Shared fixtures: a real server process on 127.0.0.1, stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import settings
from zygote_process import MemberProcess, close_the_zygote, start_cluster_process

# Hypothesis's per-example deadline (200 ms) is a timing assertion: on a loaded box (CI
# shares two cores between two pytest workers, member processes and Spark) an example
# that does real work passed it now and then and failed the test as "flaky". What the
# properties check is behaviour; speed is for benchmarks/.
settings.register_profile("migratory", deadline=None)
settings.load_profile("migratory")

if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    # Each worker picks clusters' base ports from its own slice (cluster.tooling's
    # PORT_SLICE_ENV; the member processes and commands the tests start inherit it): two
    # workers' clusters found the same ports free and the second to bind failed.
    _worker = os.environ["PYTEST_XDIST_WORKER"][2:]
    _workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    os.environ["MIGRATORY_BASE_PORT_SLICE"] = f"{_worker}/{_workers}"

CLUSTER_SIZED = ("bench", "browser", "chaos", "cluster", "deploy", "spark")
"""The test directories whose tests start clusters of member processes, Spark's JVM, a
browser or a load generator. ``make test`` runs them in two scopes, each one test after
another: ``tests/cluster`` and the rest of them (chaos runs, the Kubernetes rehearsal,
the browser, the benchmarks' smoke tests; ``IN_THE_OTHER_SERIAL_SCOPE`` too), and
tests/spark in a third that the worker of the small files takes among them.
Their tests mostly wait (elections,
timeouts, processes starting): the whole suite used 0.88 of the two cores on average
with them all in one scope, which took 16 of its 17.5 minutes while the other worker
finished the rest -- server, client, protocol, model, config, a test file at a time --
in about four.

``make test`` has three workers (``-n 3``): the two serial scopes side by side on two
of them, the small files on the third from the start (xdist hands a worker another
scope only when it has at most two tests left, so with ``-n 2`` the small files all
waited for the first serial scope to drain, and ran after it: 1,754 tests, 6.8 min in
one process on a busy box). At most two cluster-sized tests still run at once; a
drained worker takes what is left of the small files (tests/test_xdist_lanes.py)."""


IN_PROCESS_CLUSTER = frozenset(
    f"tests/cluster/{name}.py"
    for name in (
        # real pysyncobj nodes on raft_sim's simulated clock and network
        "test_raft_safety", "test_raft_power_loss", "test_raft_forward_sim",
        "test_raft_partial_partitions", "test_raft_votes", "test_raft_catch_up",
        "test_raft_applied_entry", "test_raft_dump_chunks", "test_raft_dump_kept_tail",
        "test_raft_dump_older",  # (test_raft_dump_received forks a dump writer: cluster scope)
        "test_raft_term_query", "test_raft_orphaned_callbacks", "test_raft_slow_disk",
        # sans-I/O: link connections, the cluster model, caches, bytes in and out
        "test_cluster_link_ops", "test_cluster_machine", "test_cluster_planted",
        "test_replicated_cache", "test_raft_front", "test_link_sync", "test_cluster_checker",
        "test_publishing", "test_cluster_stream", "test_cluster_raft_outcomes",
        "test_cluster_replica", "test_cluster_cache_sync", "test_cluster_coordination",
        "test_batch_ring", "test_raft_digest",
        # found by h116 in the cluster scope, starting nothing either (the guard of
        # tests/test_xdist_lanes.py passes them): ~80 s of its ~2,400 s on a box at load 25
        "test_link_limits", "test_raft_follower", "test_raft_empty_start_five",
        "test_raft_election_timer", "test_raft_forwarded_commands", "test_raft_durability",
        "test_raft_data_dir_start", "test_raft_forward", "test_cluster_upgrade_link",
        "test_agreement", "test_standard_lineage", "test_standard_resync",
    )
)
"""The files of ``tests/cluster`` that start no process, socket, thread or real timer:
nothing in them waits on the wall clock, so the box's load changes only how long they
take. They run a file at a time beside the serial scopes, as the small files do: 120 s
of the cluster scope's 990 s (one process, a busy box), 66 s of it the seeded Raft
safety search. tests/test_xdist_lanes.py checks what they import."""


IN_THE_OTHER_SERIAL_SCOPE = frozenset(
    f"tests/cluster/{name}.py"
    for name in (
        # Workers = N: one server, its supervisor and worker processes (no cluster)
        "test_workers_kills", "test_workers_mqtt_kills", "test_workers_mqtt_reads",
        "test_workers_output", "test_workers_publish_kills", "test_workers_resume_faults",
        "test_workers_signals", "test_workers_sync_kill", "test_workers_transports",
        "test_workers", "test_workers_hang", "test_workers_faults", "test_workers_cores",
        # with tests/spark in a scope of its own (h139): `migratory cluster up`, TLS
        # members, members of the recorded older version
        "test_cluster_up", "test_cluster_tls", "test_cluster_mixed_versions",
        # (test_cluster_mqtt_connect_race, here since the CI of e140b707, is back in the
        # cluster scope, ~21 s: LocalCluster.stop() closing the tests' raw clients took 85 s
        # of close lingers (15 tests, 5 s a stop) out of the cluster scope, ~14 s out of this)
    )
)
"""Files of ``tests/cluster`` that run in the other serial scope (``cluster-sized``), so
that the two end together. In CI (8c61a85's ``make test`` in a clean clone, -n 3,
13:30 of pytest) the cluster scope's worker ended at 23:03:03, after its Workers = N
files (23:01:38 on); the other serial scope's at about 23:01:12 (Spark last) and the
small files' at about 23:00: the cluster scope ran alone for its last ~110 s. These
files are 111 of 169 s and 99 of 149 s of the Workers = N files in one process here (load 5),
about 58 s of CI's ~88: both serial scopes now end about 55 s sooner than the cluster
scope did. Still one test at a time in either scope, at most two of them at once.

h139 (5c102f6, each scope alone in one process, load 10-13): cluster 1,136 s (1,065
without two tests that timed out), cluster-sized 1,019 s of which tests/spark 221 s, the
small files and in-process cluster files 670 s: the third worker stood idle for a third
of the run. tests/spark is now a scope of its own that the third worker takes among the
small files (Spark's JVM reads history files: no election or timeout to miss on a busy
box; one more JVM start, in that worker), and the last seven files above (132 s there)
moved here: about 930 s for each of the three."""


BESIDE_SPARK = frozenset(
    f"tests/cluster/{name}.py"
    for name in (
        # a frozen member under an SDK and a JS subscriber (~24 s in CI)
        "test_cluster_frozen_member",
    )
)
"""Files of ``tests/cluster`` that run in the ``spark`` scope, after tests/spark, on the
worker of the small files: with no adaptive query execution (spark_analysis/session.py)
tests/spark takes less time (alone on a loaded box 220 s, 336 s in the CI of 0dfa9a5f),
and the cluster scope was the longest of the three (858 s, 866 s and 866 s there). The
summary of ``make test`` names each worker's slowest files of a serial scope: what to
move next."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with two scopes for the cluster-sized tests (its
    ``loadgroup`` marks do not reach pytest 9's node ids) and one per other file
    (``IN_PROCESS_CLUSTER`` included)."""
    from xdist.scheduler import LoadScopeScheduling

    class ClusterSizedApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ClusterSizedApart(config, log)


def scope_of(nodeid: str) -> str:
    """``cluster``, ``cluster-sized`` or ``spark`` (the serial scopes; ``spark`` holds
    ``BESIDE_SPARK`` too), else the test's file."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if path in IN_PROCESS_CLUSTER:
        return path
    if path in IN_THE_OTHER_SERIAL_SCOPE:
        return "cluster-sized"
    if path in BESIDE_SPARK:
        return "spark"
    if path.startswith("tests/spark/"):
        return "spark"
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in CLUSTER_SIZED:
        return "cluster" if parts[1] == "cluster" else "cluster-sized"
    return path


SERIAL_SCOPES = ("cluster", "cluster-sized", "spark")


# What each xdist worker ran and when it ended, at the end of the run (make test): which
# serial scope held the run up, and how long the other workers stood idle
LANE_TIME: dict[str, list[float]] = {}
"""In a worker: serial scope (or ``files``) -> [tests, seconds]."""
FILE_TIME: dict[str, float] = {}
"""In a worker: test file of a serial scope -> seconds (what to move to balance them)."""
SLOWEST_FILES = 12
"""How many of each serial scope's slowest files the summary names."""
WORKERS_DOWN: dict[str, dict[str, Any]] = {}
"""In the controller: worker id -> what the worker said at its end."""
SESSION_START = [time.time()]


def pytest_sessionstart(session: pytest.Session) -> None:
    SESSION_START[0] = time.time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    started = time.monotonic()
    yield
    scope = scope_of(item.nodeid)
    lane = LANE_TIME.setdefault(scope if scope in SERIAL_SCOPES else "files", [0, 0.0])
    took = time.monotonic() - started
    lane[0] += 1
    lane[1] += took
    if scope in SERIAL_SCOPES:
        path = item.nodeid.split("::", 1)[0]
        FILE_TIME[path] = FILE_TIME.get(path, 0.0) + took


def pytest_sessionfinish(session: pytest.Session) -> None:
    close_the_zygote()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["lanes"] = LANE_TIME
        workeroutput["files"] = FILE_TIME
        workeroutput["ended"] = time.time()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    said = getattr(node, "workeroutput", None) or {}
    if "lanes" in said:
        WORKERS_DOWN[node.gateway.id] = said


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not WORKERS_DOWN:
        return
    terminalreporter.write_sep("-", "xdist workers: what each ran, and when it ended")
    for worker, said in sorted(WORKERS_DOWN.items()):
        ran = ", ".join(f"{lane} {int(n)} tests {s:.0f} s" for lane, (n, s) in
                        sorted(said["lanes"].items()))
        terminalreporter.write_line(
            f"{worker}: ended at {said['ended'] - SESSION_START[0]:.0f} s: {ran}")
        files = sorted(said.get("files", {}).items(), key=lambda f: -f[1])
        for path, seconds in files[:SLOWEST_FILES]:
            terminalreporter.write_line(f"    {seconds:6.1f} s  {scope_of(path)}  {path}")

class ServerProcess:
    def __init__(self, settings: dict[str, str], log_dir: Path, listeners: int = 1,
                 exec_server: bool = False) -> None:
        """Forked from the tests' zygote (``tests/zygote.py``), or exec'd with
        ``exec_server`` (a test of the interpreter's start)."""
        args = [sys.executable, "-m", "cluster", "serve", "--set", "Listen=127.0.0.1:0"]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        self.log_path = log_dir / f"server-{time.monotonic_ns()}.log"
        self._log: IO[bytes] = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}
        if exec_server:
            self.proc: MemberProcess = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=self._log, env=env)
        else:
            self.proc = start_cluster_process(
                args, env=env, stdout=subprocess.PIPE, stderr=self._log)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening ws://"):
            self.stop()
            raise RuntimeError(f"server did not start: {line!r}\n{self.log()}")
        self.port = int(line.rsplit(":", 1)[1])
        self.urls = [line.split()[1]]  # one per listener: ws://host:port, wss://host:port
        while len(self.urls) < listeners:
            self.urls.append(self.proc.stdout.readline().decode().split()[1])
        self.mqtt_port = 0  # with ListenMqtt: its first port (the next ready line)
        self.mqtts_port = 0  # with ListenMqttEncrypted: its first port (the line after)
        for key, scheme in (("ListenMqtt", "mqtt"), ("ListenMqttEncrypted", "mqtts")):
            if settings.get(key):
                line = self.proc.stdout.readline().decode()
                if not line.startswith(f"listening {scheme}://"):
                    self.stop()
                    raise RuntimeError(f"no {key} listener: {line!r}\n{self.log()}")
                setattr(self, f"{scheme}_port", int(line.rsplit(":", 1)[1]))

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        if not self._log.closed:  # (stop() closes it: a server that did not start)
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_logged(self, text: str) -> str:
        """The log once it holds ``text`` (its lines are written by a thread of their
        own: one may come a moment after what it tells of). AssertionError after 10 s."""
        for _ in range(1000):
            log = self.log()
            if text in log:
                return log
            time.sleep(0.01)
        raise AssertionError(f"never logged {text!r}:\n{self.log()}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    """Factory: ``start_server(BatchTime="0", ...)`` → a running :class:`ServerProcess`."""
    started: list[ServerProcess] = []


    def start(*, listeners: int = 1, exec_server: bool = False, **settings: str) -> ServerProcess:
        server = ServerProcess(settings, tmp_path, listeners, exec_server)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# The tests' JVM checks small histories for a few minutes: with the C1 JIT alone it
# spends far less CPU compiling (tests/spark/test_spark_submit.py runs its JVM the
# same way); what the checker computes does not depend on it. Nor on the other two:
# interpreted expressions instead of generated and compiled Java (Janino compiling each
# query's stages was most of a check of a few thousand rows), and one shuffle partition
# instead of 4 (a few thousand rows: each partition's task is overhead). JVM CPU of the
# checks of make test's two chaos runs, in one JVM as in its cluster-sized lane: the
# planted run's (first, cold) 45-48 s -> 30-32 s, the scenario run's (17k publishes)
# 27 s -> 16 s (2 cores, load 8-20); the reports the same. The serial collector: no CPU
# on G1's concurrent and parallel GC threads (a crash analysis and the merged planted one
# in one session: 7.7 s of GC threads' CPU -> 3.5 s, h166; test_spark_submit.py too)
TEST_SPARK_SETTINGS = (
    "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.codegen.wholeStage=false",
    "spark.sql.codegen.factoryMode=NO_CODEGEN",
    "spark.sql.shuffle.partitions=1",
    "spark.default.parallelism=1",
)


class SparkStarting:
    """The tests' one local Spark session, started in a thread on :meth:`start`, so that
    a test can go on while the JVM starts (8-28 s: the planted chaos run starts it once
    its cluster is up); :meth:`get` starts it if need be, waits for it, and raises what
    starting it raised."""

    def __init__(self) -> None:
        self._session: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread.ident is None:
                self._thread.start()

    def _start(self) -> None:
        from spark_analysis.session import spark_session

        given = os.environ.get("SA_CONF")  # spark_session's extra settings, read at start
        os.environ["SA_CONF"] = ";".join(filter(None, [*TEST_SPARK_SETTINGS, given]))
        try:
            self._session = spark_session("migratory-tests")
        except BaseException as exc:
            self._error = exc
        finally:
            if given is None:
                del os.environ["SA_CONF"]
            else:
                os.environ["SA_CONF"] = given

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def get(self, timeout: float = 300) -> Any:
        self.start()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the Spark session did not start in {timeout:g} s")
        if self._error is not None:
            raise RuntimeError("the Spark session did not start") from self._error
        return self._session


@pytest.fixture(scope="session")
def spark_starting() -> Iterator[SparkStarting]:
    """The Spark session, to start early (``start()``) and get (``get()``) when needed."""
    starting = SparkStarting()
    yield starting
    if starting.started:
        starting.get().stop()


@pytest.fixture(scope="session")
def spark(spark_starting: SparkStarting) -> object:
    """One local Spark session for every test that checks histories (start 8-28 s)."""
    return spark_starting.get()
