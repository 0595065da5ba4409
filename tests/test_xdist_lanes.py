"""How ``make test`` spreads the suite over its xdist workers (tests/conftest.py): the
two serial scopes (``tests/cluster``; bench/browser/chaos/deploy/spark) each on a worker
of its own, and the rest -- server, client, protocol, model, config, a file at a time --
on another worker from the start, beside them.

With ``-n 2`` the two serial scopes took both workers and the ~1,750 other tests
waited until one of them had drained (xdist hands a worker another scope only when it
has at most two tests left), then ran after it, while the serial scopes mostly wait on
processes (the suite used about half of the box's two cores)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERIAL = {"cluster", "cluster-sized"}


@pytest.fixture
def suite(pytestconfig: pytest.Config) -> ModuleType:
    """tests/conftest.py as pytest loaded it (every ``conftest`` module has that name, so
    ``import conftest`` gets whichever directory's was loaded last)."""
    path = str(ROOT / "tests" / "conftest.py")
    (module,) = [p for p in pytestconfig.pluginmanager.get_plugins()
                 if getattr(p, "__file__", None) == path]
    assert isinstance(module, ModuleType)
    return module


def make_test_workers() -> int:
    """The ``-n`` of the Makefile's pytest line, as ``make test`` runs it."""
    (workers,) = re.findall(r"-m pytest -n (\d+)", (ROOT / "Makefile").read_text())
    return int(workers)


class Worker:
    """The part of xdist's WorkerController the scheduler uses."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_runtest_all(self) -> None:
        raise AssertionError("loadscope sends tests by index")

    def shutdown(self) -> None:
        self.shutting_down = True


def collection() -> list[str]:
    """A suite shaped like ours: many cluster tests, fewer cluster-sized ones in several
    directories, and the rest in many small files."""
    ids = [f"tests/cluster/test_c{f}.py::test_{i}" for f in range(30) for i in range(25)]
    ids += [f"tests/{d}/test_{d}.py::test_{i}" for d in ("bench", "chaos", "deploy")
            for i in range(100)]
    ids += [f"tests/spark/test_spark{f}.py::test_{i}" for f in range(3) for i in range(8)]
    ids += [f"tests/{d}/test_{d}{f}.py::test_{i}" for d in ("server", "protocol", "client")
            for f in range(20) for i in range(20)]
    ids += [f"tests/test_config{f}.py::test_{i}" for f in range(5) for i in range(10)]
    return sorted(ids)


def started(suite: ModuleType, workers: int) -> tuple[list[Worker], list[str], Any]:
    config = SimpleNamespace(
        getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None,
        option=SimpleNamespace(loadscopereorder=True),
    )
    log = SimpleNamespace(loadscopesched=lambda *args: None)
    scheduler = suite.pytest_xdist_make_scheduler(config, log)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    ids = collection()
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, ids)
    scheduler.schedule()
    return nodes, ids, scheduler


def scopes(node: Worker, ids: list[str], scheduler: Any) -> set[str]:
    return {scheduler._split_scope(ids[i]) for i in node.sent}


def test_the_rest_starts_beside_the_two_serial_scopes(suite: ModuleType) -> None:
    workers = make_test_workers()
    nodes, ids, scheduler = started(suite, workers)
    at_start = [scopes(node, ids, scheduler) for node in nodes]
    serial = [s & SERIAL for s in at_start]
    # each serial scope whole on one worker, never both on the same one
    assert sorted(next(iter(s)) for s in serial if s) == sorted(SERIAL), at_start
    assert all(len(s) <= 1 for s in serial), at_start
    # and the small files already running on a worker with no serial scope
    rest = [s for s in at_start if not s & SERIAL]
    assert rest and all(s for s in rest), (workers, at_start)


def test_a_drained_serial_worker_takes_what_is_left_of_the_rest(suite: ModuleType) -> None:
    nodes, ids, scheduler = started(suite, make_test_workers())
    cluster = next(n for n in nodes if "cluster" in scopes(n, ids, scheduler))
    waiting = len(scheduler.workqueue)
    assert waiting, "every scope was handed out at once: nothing left to fill in"
    for index in cluster.sent[:-2]:  # all but the last two tests done
        scheduler.mark_test_complete(cluster, index)
    assert len(scopes(cluster, ids, scheduler) - SERIAL) == 1
    assert len(scheduler.workqueue) == waiting - 1


def test_spark_runs_whole_on_a_worker_that_holds_no_other_serial_scope(
    suite: ModuleType,
) -> None:
    """tests/spark (Spark's JVM, no timing: histories read from files) is a scope of its
    own, handed out as the small files are: to the worker beside the two serial scopes,
    not behind one of them (one JVM per worker that runs Spark: the chaos runs of the
    cluster-sized scope start their own)."""
    nodes, ids, scheduler = started(suite, make_test_workers())
    (rest,) = [n for n in nodes if not scopes(n, ids, scheduler) & SERIAL]
    done = 0
    while "spark" not in scopes(rest, ids, scheduler) and done < len(rest.sent):
        scheduler.mark_test_complete(rest, rest.sent[done])
        done += 1
    assert "spark" in scopes(rest, ids, scheduler)
    spark = {i for i, nodeid in enumerate(ids) if nodeid.startswith("tests/spark/")}
    assert spark <= set(rest.sent)
    assert all(not spark & set(n.sent) for n in nodes if n is not rest)


def test_cluster_files_that_start_nothing_run_beside_the_serial_scopes(
    suite: ModuleType,
) -> None:
    def split(nodeid: str) -> str:
        return str(started(suite, 1)[2]._split_scope(nodeid))

    assert split("tests/cluster/test_raft_safety.py::test_x") == "tests/cluster/test_raft_safety.py"
    assert split("tests/cluster/test_cluster_link_ops.py::test_x[a]") == (
        "tests/cluster/test_cluster_link_ops.py"
    )
    # the sans-I/O link bounds and the Raft follower rule, in the cluster scope before
    for name in ("test_link_limits", "test_raft_follower", "test_raft_empty_start_five"):
        assert split(f"tests/cluster/{name}.py::test_x") == f"tests/cluster/{name}.py"
    # what starts members, Raft on sockets or threads stays in the cluster scope
    assert split("tests/cluster/test_cluster_processes.py::test_x") == "cluster"
    assert split("tests/cluster/test_raft_compaction.py::test_x") == "cluster"
    assert split("tests/chaos/test_chaos_schedule.py::test_x") == "cluster-sized"
    assert split("tests/spark/test_spark_analysis.py::test_x") == "spark"


def test_the_workers_files_moved_to_the_other_serial_scope_run_there(suite: ModuleType) -> None:
    """The files of ``IN_THE_OTHER_SERIAL_SCOPE`` exist, start processes (they are no
    in-process file to run beside the serial scopes) and run in the ``cluster-sized``
    scope, one test at a time with the chaos runs, plays and Spark; the rest of
    tests/cluster stays in its own."""
    split = started(suite, 1)[2]._split_scope
    moved = sorted(suite.IN_THE_OTHER_SERIAL_SCOPE)
    assert moved and not set(moved) & suite.IN_PROCESS_CLUSTER
    for path in moved:
        assert (ROOT / path).exists(), path
        assert path.startswith("tests/cluster/test_"), path
        assert split(f"{path}::test_x") == "cluster-sized"
    assert split("tests/cluster/test_workers_heartbeats.py::test_x") == "cluster"
    assert split("tests/cluster/test_cluster_start_signals.py::test_x") == "cluster"


def test_the_cluster_files_beside_spark_run_in_its_scope(suite: ModuleType) -> None:
    """The files of ``BESIDE_SPARK`` exist, are neither in-process nor moved to the other
    serial scope, and run in the ``spark`` scope: one test at a time, on the worker that
    runs no other serial scope, after (or before) tests/spark."""
    split = started(suite, 1)[2]._split_scope
    moved = sorted(suite.BESIDE_SPARK)
    assert moved
    assert not set(moved) & (suite.IN_PROCESS_CLUSTER | suite.IN_THE_OTHER_SERIAL_SCOPE)
    for path in moved:
        assert (ROOT / path).exists(), path
        assert path.startswith("tests/cluster/test_"), path
        assert split(f"{path}::test_x") == "spark"
        assert split(f"{path}::test_x[js]") == "spark"
    assert split("tests/cluster/test_cluster_drain.py::test_x") == "cluster"


# what a test starts when it starts a process, a socket, a thread or a real Raft node
STARTS_SOMETHING = {
    "subprocess", "socket", "threading", "multiprocessing", "selectors", "asyncio",
    "cluster_fixture", "cluster_load", "tcp_gate", "limited_seed", "faulty_member",
    "raft_port_probe", "listen_ports", "conftest", "cluster.tooling",
    "cluster.node", "cluster.workers", "cluster.raft_transport", "cluster.raft_front_server",
}
STARTERS = {"open_tcp_stream", "serve_tcp", "open_tcp_listeners", "start_server",
            "RaftCoordination", "SeedCoordination", "LocalCluster", "Popen", "sleep"}


def imports_and_names(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return modules, names


def test_the_cluster_files_run_beside_start_no_process_socket_or_thread(
    suite: ModuleType,
) -> None:
    """Each file of ``IN_PROCESS_CLUSTER``, and the helpers of tests/cluster it imports,
    imports nothing that starts a process, a socket, a thread or a Raft node on real
    timers, and calls no sleep: a file that does belongs in the cluster scope."""
    listed = sorted(suite.IN_PROCESS_CLUSTER)
    assert listed, "nothing listed"
    helpers = ROOT / "tests" / "cluster"
    for path in listed:
        assert (ROOT / path).exists(), path
        seen: set[Path] = set()
        todo = [ROOT / path]
        while todo:
            source = todo.pop()
            if source in seen:
                continue
            seen.add(source)
            modules, names = imports_and_names(source)
            starting = {m for m in modules if m in STARTS_SOMETHING or m.startswith("test_w")}
            called = {n for n in names if n.rsplit(".", 1)[-1] in STARTERS}
            assert not starting and not called, (path, source.name, starting, called)
            todo += [helpers / f"{m}.py" for m in modules if (helpers / f"{m}.py").exists()]


def test_the_summary_names_each_workers_slowest_serial_files(
    suite: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What to move to balance the serial scopes: each worker's line, then its slowest
    files of a serial scope (at most ``SLOWEST_FILES``), slowest first, with their scope."""
    files = {f"tests/cluster/test_c{i}.py": float(i) for i in range(suite.SLOWEST_FILES + 3)}
    files["tests/spark/test_s.py"] = 99.5
    said = {"lanes": {"cluster": [40, 80.0]}, "files": files, "ended": 1100.0}
    monkeypatch.setattr(suite, "WORKERS_DOWN", {"gw2": said})
    monkeypatch.setattr(suite, "SESSION_START", [1000.0])
    lines: list[str] = []
    reporter = SimpleNamespace(write_sep=lambda *a: None, write_line=lines.append)
    suite.pytest_terminal_summary(reporter)
    assert lines[0] == "gw2: ended at 100 s: cluster 40 tests 80 s"
    assert lines[1].split() == ["99.5", "s", "spark", "tests/spark/test_s.py"]
    shown = [line.split()[-1] for line in lines[2:]]
    top = suite.SLOWEST_FILES + 2
    assert shown == [f"tests/cluster/test_c{i}.py" for i in range(top, 3, -1)]
    assert all(line.split()[2] == "cluster" for line in lines[2:])
