"""A child forked by a member (pysyncobj's dump writer) holds none of its ports and
dies with it.

Each scenario runs in a fresh interpreter: ``os.register_at_fork`` handlers cannot be
removed, and another test may already have registered ours in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from cluster import dump_fork

SCENARIO = """
import os, socket, sys, time
from cluster import dump_fork
if sys.argv[1] == "register":
    dump_fork.register()
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen()
port = sock.getsockname()[1]
child = os.fork()
if child == 0:
    time.sleep(3)
    os._exit(0)
time.sleep(0.5)
sock.close()
again = socket.socket()
again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    again.bind(("127.0.0.1", port))
    again.listen()
    print("free")
except OSError:
    print("taken")
os.kill(child, 9)
os.waitpid(child, 0)
"""


def port_after_fork(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, mode], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_the_handler_a_forked_child_keeps_the_port() -> None:
    assert port_after_fork("plain") == "taken"


def test_with_the_handler_the_port_is_free_once_the_member_lets_go() -> None:
    assert port_after_fork("register") == "free"


NICENESS = """
import os, sys
from cluster import dump_fork
if sys.argv[1] == "register":
    dump_fork.register()
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, str(os.getpriority(os.PRIO_PROCESS, 0)).encode())
    os._exit(0)
os.waitpid(child, 0)
print(os.getpriority(os.PRIO_PROCESS, 0), int(os.read(read, 16)))
"""


def niceness_after_fork(mode: str) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", NICENESS, mode], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    parent, child = done.stdout.split()
    return int(parent), int(child)


def test_the_dump_writer_yields_the_cpu_to_the_members() -> None:
    """Every seed forks its dump writer at the same log index; at the member's own
    priority the writers took the CPU from the members (ack p99.9 misses)."""
    parent, child = niceness_after_fork("register")
    assert parent < dump_fork.DUMP_WRITER_NICENESS
    assert child == dump_fork.DUMP_WRITER_NICENESS
    assert niceness_after_fork("plain") == (parent, parent)


def test_the_child_dies_with_its_parent() -> None:
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # the "member": forks a "dump writer", then dies
        grandchild = os.fork()
        if grandchild == 0:
            dump_fork.die_with_parent(os.getppid())
            time.sleep(30)
            os._exit(0)
        os.write(write, str(grandchild).encode())
        time.sleep(0.3)
        os._exit(0)
    os.close(write)
    grandchild = int(os.read(read, 64))
    os.close(read)
    os.waitpid(middle, 0)
    deadline = time.monotonic() + 5
    alive = True
    while alive and time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            alive = False
    assert not alive, "the dump writer outlived the member"
