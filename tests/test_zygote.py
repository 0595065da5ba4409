"""The tests' zygote (tests/zygote.py, tests/zygote_process.py): its children are what an
exec'd ``python -c``/``-m cluster`` would be, and are reported as Popen reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from zygote_process import ForkedProcess, Zygote, start_cluster_process, the_zygote

PROBE = """
import json, os, random, signal, sys
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps({
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[0], "cwd": os.getcwd(),
    "env": dict(os.environ), "fds": fds[:-1],  # (the last: listdir's own)
    "signals": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals()
                if s not in (signal.SIGKILL, signal.SIGSTOP)},
    "streams": [(s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.write_through,
                 type(s.buffer).__name__) for s in (sys.stdin, sys.stdout, sys.stderr)],
    "dunder": sys.stdout is sys.__stdout__ and sys.stdin is sys.__stdin__,
    "flags": list(sys.flags), "pycache": sys.pycache_prefix, "random": random.random(),
    "main": __name__, "stdin": sys.stdin.read(),
}))
"""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def forked(args: list[str], **streams: object) -> ForkedProcess:
    process = start_cluster_process(args, env=dict(os.environ), **streams)  # type: ignore[arg-type]
    assert isinstance(process, ForkedProcess)
    return process


def probe_of(process: ForkedProcess | subprocess.Popen[bytes]) -> dict[str, object]:
    assert process.stdout is not None
    said = json.loads(process.stdout.read())
    assert process.wait(10) == 0
    process.stdout.close()
    return said  # type: ignore[no-any-return]


def test_a_child_is_what_an_exec_would_be(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"given on stdin")
    env = {**os.environ, "ZYGOTE_PROBE": "one"}
    runs = []
    for start in (start_cluster_process, subprocess.Popen):
        with (tmp_path / "in").open("rb") as stdin:
            process = start(python(PROBE, "x", "--y"), env=env, stdin=stdin,  # type: ignore[operator]
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        runs.append((type(process).__name__, probe_of(process)))
    (kind, fork), (_, exec_) = runs
    assert kind == "ForkedProcess"
    assert fork["random"] != exec_["random"]
    fork.pop("random"), exec_.pop("random")
    assert fork == exec_
    assert fork["env"] == env and fork["stdin"] == "given on stdin"
    assert fork["argv"] == ["-c", "x", "--y"] and fork["fds"] == [0, 1, 2]


def test_two_children_differ_in_random_state() -> None:
    code = "import random; print(random.getrandbits(64))"
    first, second = (forked(python(code), stdout=subprocess.PIPE) for _ in range(2))
    assert first.stdout is not None and second.stdout is not None
    assert first.stdout.read() != second.stdout.read()
    first.stdout.close(), second.stdout.close()
    assert first.wait(10) == second.wait(10) == 0


@pytest.mark.parametrize("code", [
    "import sys; sys.exit(3)",
    "raise ValueError('out')",
    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "import os, signal; os.kill(os.getpid(), signal.SIGINT)",  # KeyboardInterrupt: -2
    "import atexit, os; atexit.register(os._exit, 7)",
    "import threading, time, sys; threading.Thread(target=lambda: (time.sleep(0.3), sys.exit(0)))"
    ".start()",
    "import sys; sys.stdout.write('unflushed'); sys.exit(5)",
])
def test_exit_status_as_popen_reports_it(code: str) -> None:
    statuses = []
    for start in (start_cluster_process, subprocess.Popen):
        process = start(python(code), env=dict(os.environ), stdout=subprocess.PIPE,  # type: ignore[operator]
                        stderr=subprocess.DEVNULL)
        out = process.stdout.read()
        process.stdout.close()
        statuses.append((process.wait(10), out))
    assert statuses[0] == statuses[1]


def test_wait_timeout_then_sigkill() -> None:
    process = forked(python("import time; time.sleep(60)"))
    assert process.poll() is None
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.3)
    assert time.monotonic() - started >= 0.3
    process.kill()
    assert process.wait(10) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL
    process.kill()  # ended: nothing is signalled (as Popen)
    process.send_signal(signal.SIGTERM)


def test_poll_sees_an_end_at_once() -> None:
    process = forked(python("import time; time.sleep(60)"))
    os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{process.pid}/stat").exists() \
            and Path(f"/proc/{process.pid}/stat").read_text().split()[2] != "Z":
        time.sleep(0.01)
    assert process.poll() == -signal.SIGTERM


def test_an_orphan_is_reaped_by_the_zygote() -> None:
    code = ("import os, time\n"  # (it reads its parent once the child has gone: a fixed
            "parent = os.getpid()\n"  # 0.5 s was once too short for the child's exit at load 15)
            "if os.fork() == 0:\n"
            "    deadline = time.monotonic() + 10\n"
            "    while os.getppid() == parent and time.monotonic() < deadline:\n"
            "        time.sleep(0.01)\n"
            "    print(os.getpid(), os.getppid(), flush=True); os._exit(0)\n")
    process = forked(python(code), stdout=subprocess.PIPE)
    assert process.wait(10) == 0
    assert process.stdout is not None
    grandchild, its_parent = map(int, process.stdout.readline().split())  # (re-parented)
    process.stdout.close()
    assert its_parent == the_zygote().process.pid
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists():  # a zombie until reaped
        assert time.monotonic() < deadline, Path(f"/proc/{grandchild}/stat").read_text()
        time.sleep(0.02)


def test_many_children_at_once() -> None:
    processes: list[ForkedProcess] = []
    lock = threading.Lock()

    def start(code: int) -> None:
        process = forked(python(f"import sys, time; time.sleep(0.2); sys.exit({code})"))
        with lock:
            processes.append(process)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.wait(20) for p in processes) == list(range(24))
    assert len({p.pid for p in processes}) == 24


TEST_PROCESS = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from zygote_process import the_zygote
zygote = the_zygote()
print(zygote.process.pid, flush=True)
if sys.argv[2] == "eof":
    zygote.close()
    print(zygote.process.returncode, flush=True)
else:  # the control socket held open by another process: no EOF, PR_SET_PDEATHSIG alone
    holder = subprocess.Popen(["sleep", "30"], pass_fds=[zygote.control.fileno()])
    print(holder.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("end", ["killed", "eof"])
def test_the_zygote_ends_with_its_test_process(end: str) -> None:
    tests = str(Path(__file__).parent)
    owner = subprocess.Popen([sys.executable, "-c", TEST_PROCESS, tests, end],
                             stdout=subprocess.PIPE, text=True)
    holder = 0
    try:
        assert owner.stdout is not None
        zygote = int(owner.stdout.readline())
        if end == "eof":
            assert owner.stdout.readline().strip() == "0"
        else:
            holder = int(owner.stdout.readline())
            owner.kill()
            owner.wait(10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{zygote}").exists():
            assert time.monotonic() < deadline, f"zygote {zygote} outlived its test process"
            time.sleep(0.02)
    finally:
        if holder:
            os.kill(holder, signal.SIGKILL)
        owner.kill()
        owner.wait(10)
        assert owner.stdout is not None
        owner.stdout.close()


def test_exec_where_a_fork_would_differ(tmp_path: Path) -> None:
    code = "print('x')"
    for env, cwd in (({**os.environ, "PYTHONHASHSEED": "1"}, None),
                     ({**os.environ, "PYTHONDONTWRITEBYTECODE": "x"}, None),
                     (dict(os.environ), str(tmp_path))):
        process = start_cluster_process(python(code), env=env, cwd=cwd,
                                        stdout=subprocess.DEVNULL)
        assert isinstance(process, subprocess.Popen)
        assert process.wait(10) == 0


def test_a_member_refusing_its_settings_as_exec_would(tmp_path: Path) -> None:
    said = []
    for start in (start_cluster_process, subprocess.Popen):
        with (tmp_path / "err").open("wb") as err:
            process = start([sys.executable, "-m", "cluster", "serve", "--set", "Nonsense=1"],  # type: ignore[operator]
                            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=err)
        said.append((type(process).__name__, process.wait(20), (tmp_path / "err").read_text()))
    assert said[0][0] == "ForkedProcess"
    assert said[0][1:] == said[1][1:] and said[0][1] != 0, said


def test_a_zygote_outlives_the_thread_that_started_it() -> None:
    """``PR_SET_PDEATHSIG`` fires when the thread that started the zygote ends: a zygote
    first started from a trio worker thread (ended after 10 s idle) was SIGKILLed (-9)
    and its children's statuses lost; every zygote is started from one thread that lasts."""
    started: list[Zygote] = []
    thread = threading.Thread(target=lambda: started.append(Zygote()))
    thread.start()
    thread.join()
    zygote = started[0]
    try:
        time.sleep(0.5)
        assert zygote.process.poll() is None and not zygote.gone
    finally:
        zygote.close()
    assert zygote.process.returncode == 0
