"""Run a pod's container command as a local process with the pod's own view of the
world: its own network namespace (so ``Listen = 0.0.0.0:8800`` is the pod's port),
its hostname, an ``/etc/hosts`` standing in for cluster DNS, the ConfigMap files
and the persistent volume bind-mounted at their mount paths. Needs root (unshare).
The process is the container's main process: a signal to ``pid`` reaches the server.
Given the play's :class:`pod_fork.PodZygotes`, a Python command is forked from a zygote
into the namespaces a holder process keeps for it (``pod_fork.py``); else exec'd.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from k8s_manifests import PodView
from pod_fork import PodZygotes
from zygote_process import MemberProcess

PROBE = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=2)\n"
    "    print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code); print(e.read().decode())\n"
    "except OSError as e:\n"
    "    print(0); print(e)\n"
)


WARM_BYTECODE = (
    "import compileall, importlib.util, sys\n"
    "for package in sys.argv[1:]:\n"
    "    compileall.compile_dir(package, quiet=1)\n"
    "for name in ('pysyncobj', 'cryptography'):  # (a seed's Raft imports them later)\n"
    "    found = importlib.util.find_spec(name).submodule_search_locations\n"
    "    compileall.compile_dir(found[0], quiet=1)\n"
    "import cluster.cli, cluster.members, cluster.node, migratory.server.run\n"
    "import gzip, stringprep, encodings.idna, encodings.latin_1\n"
)
"""What a member's start imports, into a bytecode cache: the project's packages (given),
the Raft's dependencies, the modules of a member's start. A module left out is only
compiled in each pod again (found by ``-X importtime`` in a pod: 63 of its 534 modules
had no bytecode in the cache with the imports alone)."""


def bytecode_cache(bin_dir: Path, packages: list[Path]) -> Path:
    """A bytecode cache (``PYTHONPYCACHEPREFIX``) for pods started from ``bin_dir``'s
    Python, holding ``packages`` (the project's sources) and what a member imports at
    start (the standard library's and the dependencies' modules, which a prefix holds
    too), written from outside the pods: the test process's own cache (``make test``'s,
    in the venv), else the venv's ``pycache``. The image's ``pip install`` compiles every
    module; a pod of the stand-in runs from the source tree on a read-only root, where
    nothing could be written, and without a cache it compiled ~200 modules at every
    start (0.93 CPU-s to import a member's modules, 0.50 from the cache; CI's pods saw
    none of ``make test``'s: the pod's environment is the manifest's). Written once for
    the same Python and sources (:func:`_warmed_stamp`): each play warmed it again, a
    process importing a member's modules, 0.33 CPU-s a play."""
    prefix = Path(sys.pycache_prefix) if sys.pycache_prefix else bin_dir.parent / "pycache"
    stamp = _warmed_stamp(prefix, bin_dir, packages)
    if stamp.exists():
        return prefix
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": ""}
    subprocess.run([str(bin_dir / "python"), "-c", WARM_BYTECODE, *map(str, packages)],
                   env=env, check=True, capture_output=True, timeout=300)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    return prefix


def _warmed_stamp(prefix: Path, bin_dir: Path, packages: list[Path]) -> Path:
    """The file that says ``prefix`` was warmed for this Python (its path and build) and
    these sources as they are (each module's path, size and modification time): a change
    of any makes another name."""
    python = (bin_dir / "python").resolve()
    digest = hashlib.sha256(f"{python} {python.stat().st_mtime_ns}\n{WARM_BYTECODE}".encode())
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            status = path.stat()
            digest.update(f"{path} {status.st_size} {status.st_mtime_ns}\n".encode())
    return prefix / "warmed" / digest.hexdigest()[:32]


def _setup(view: PodView, pod_dir: Path, mounts: list[tuple[Path, str]]) -> list[str]:
    """The shell lines that make the pod's namespaces what the pod sees: the emptyDir
    mounts come last (one may hide the directory the others come from, e.g. /tmp)."""
    lines = [
        "ip link set lo up",
        f"hostname {shlex.quote(view.hostname)}",
        f"mount --bind {shlex.quote(str(pod_dir / 'hosts'))} /etc/hosts",
    ]
    for source, target in mounts:
        lines.append(f"mkdir -p {shlex.quote(target)}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
    if view.read_only_root:  # this mount namespace only; the volumes stay writable
        lines.append("mount -o remount,bind,ro /")
    for path in view.files:  # ConfigMap volumes are read-only
        lines.append(f"mount -o remount,bind,ro {shlex.quote(path)}")
    return lines


class PodProcess:
    """One pod's container, started at once or once ``release()`` is called."""

    def __init__(
        self,
        view: PodView,
        *,
        pod_dir: Path,
        bin_dir: Path,
        hosts: str,
        held: bool = False,
        bytecode: Path | None = None,
        zygotes: PodZygotes | None = None,
    ) -> None:
        hidden = [m for m in view.scratch_mounts if bin_dir.is_relative_to(m)]
        if hidden:
            raise RuntimeError(
                f"the pod's emptyDir at {hidden[0]} would hide {bin_dir} (the command's "
                f"virtual environment): run the tests from a checkout outside {hidden[0]}"
            )
        self.view = view
        self.pod_dir = pod_dir
        self.log_path = pod_dir / "container.log"
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts: list[tuple[Path, str]] = []
        for index, (mount_path, files) in enumerate(sorted(view.files.items())):
            source = pod_dir / f"configmap-{index}"
            source.mkdir(exist_ok=True)
            for file_name, text in files.items():
                (source / file_name).write_text(text)
            mounts.append((source, mount_path))
        for index, mount_path in enumerate(view.data_mounts):
            source = pod_dir / f"volume-{index}"  # kept across restarts, as a PVC is
            source.mkdir(exist_ok=True)
            mounts.append((source, mount_path))
        for index, mount_path in enumerate(view.scratch_mounts):
            source = pod_dir / f"emptydir-{index}"  # new for every start of the pod
            shutil.rmtree(source, ignore_errors=True)
            source.mkdir()
            mounts.append((source, mount_path))
        (pod_dir / "hosts").write_text(hosts)
        env = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME": view.hostname,
            "HOME": "/nonexistent",
            **view.env,
            **({} if bytecode is None else {"PYTHONPYCACHEPREFIX": str(bytecode)}),
        }
        self._env = env
        self._zygotes = zygotes if zygotes is not None and zygotes.forks(
            list(view.command), env) else None
        self._release = pod_dir / "released"
        self._release.unlink(missing_ok=True)
        self._terminated = False
        self._log: IO[bytes] = self.log_path.open("ab")
        self._holder: subprocess.Popen[bytes] | None = None
        self._held: int | None = None
        """A forked member's release: the write end of the pipe it waits on."""
        unshare = ["unshare", "--net", "--uts", "--mount", "--", "/bin/sh", "-c"]
        self.proc: MemberProcess
        if self._zygotes is not None:  # a holder's shell sets the namespaces up at once and
            # keeps them (until EOF); the member is forked into them, held until released
            script = ["set -e", *_setup(view, pod_dir, mounts), "echo set up", "read -r _ || true"]
            self._holder = subprocess.Popen(
                [*unshare, "\n".join(script)], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._log)
            self.proc = self._fork(self._zygotes, self._holder)
        else:  # the pod's network is set up (attached) before it is released
            script = [
                "set -e",
                f"while [ ! -e {shlex.quote(str(self._release))} ]; do sleep 0.02; done",
                *_setup(view, pod_dir, mounts), 'exec "$@"',
            ]
            self.proc = subprocess.Popen(
                [*unshare, "\n".join(script), view.name, *view.command],
                env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        if not held:
            self.release()

    def _fork(self, zygotes: PodZygotes, holder: subprocess.Popen[bytes]) -> MemberProcess:
        """The member forked into ``holder``'s namespaces once it has set them up, held
        until :meth:`release` (``zygote.enter_pod``)."""
        assert holder.stdout is not None
        said = holder.stdout.readline()
        assert said == b"set up\n", f"{self.view.name}'s namespaces: {said!r}\n{self.log()}"
        fds = [os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY)
               for kind in ("net", "uts", "mnt")]
        held, self._held = os.pipe()
        try:
            with open(os.devnull, "rb") as stdin:
                return zygotes.start(list(self.view.command), self._env,
                                     [stdin.fileno(), self._log.fileno(), self._log.fileno()],
                                     [*fds, held])
        finally:
            for fd in (*fds, held):
                os.close(fd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def namespaces_pid(self) -> int:
        """A process in the pod's namespaces from the start (for its network's veth)."""
        return (self._holder or self.proc).pid

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None
        else:
            self._release.touch()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def http_get(self, path: str, port: int = 8800) -> tuple[int, str]:
        """``GET path`` from inside the pod's network namespace (as a kubelet probe);
        status 0 when nothing answers."""
        result = subprocess.run(
            ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--", "python3", "-c", PROBE,
             f"http://127.0.0.1:{port}{path}"],
            capture_output=True, text=True, timeout=10,
        )
        status, _, body = result.stdout.partition("\n")
        return int(status or 0), body

    def http_json(self, path: str, port: int = 8800) -> dict[str, object]:
        status, body = self.http_get(path, port)
        assert status == 200, (status, body)
        value: dict[str, object] = json.loads(body)
        return value

    def wait_http(self, path: str, want: int, timeout: float, port: int = 8800) -> str:
        deadline = time.monotonic() + timeout
        last: tuple[int, str] = (0, "")
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.view.name} exited:\n{self.log()}"
            last = self.http_get(path, port)
            if last[0] == want:
                return last[1]
            time.sleep(0.2)
        raise AssertionError(f"{self.view.name} {path}: {last}, not {want}\n{self.log()}")

    def terminate(self) -> None:
        """SIGTERM (what the kubelet sends), once: :meth:`stop` then waits for the exit."""
        if self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (unless :meth:`terminate` sent it), SIGKILL after ``timeout``; the exit
        code."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._held is not None:  # (never released: ended held)
            os.close(self._held)
            self._held = None
        if self._holder is not None:  # EOF: it ends (the namespaces with the member)
            assert self._holder.stdin is not None and self._holder.stdout is not None
            self._holder.stdin.close()
            self._holder.stdout.close()
            try:
                self._holder.wait(timeout)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait()
        self._log.close()
        return self.proc.returncode
