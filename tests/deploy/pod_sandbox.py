"""Run a pod's container command as a local process with the pod's own view of the
world: its own network namespace (so ``Listen = 0.0.0.0:8800`` is the pod's port),
its hostname, an ``/etc/hosts`` standing in for cluster DNS, the ConfigMap files
and the persistent volume bind-mounted at their mount paths. Needs root (unshare).
The process is the container's main process: a signal to ``pid`` reaches the server.
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
        self._release = pod_dir / "released"
        self._release.unlink(missing_ok=True)
        if not held:
            self._release.touch()
        # the pod's network is set up before it is released; the emptyDir mounts come
        # last (one may hide the directory the others come from, e.g. /tmp)
        lines = [
            "set -e",
            f"while [ ! -e {shlex.quote(str(self._release))} ]; do sleep 0.02; done",
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
        lines.append('exec "$@"')
        env = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME": view.hostname,
            "HOME": "/nonexistent",
            **view.env,
            **({} if bytecode is None else {"PYTHONPYCACHEPREFIX": str(bytecode)}),
        }
        args = ["unshare", "--net", "--uts", "--mount", "--", "/bin/sh", "-c", "\n".join(lines)]
        self._terminated = False
        self._log: IO[bytes] = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*args, view.name, *view.command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
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
            os.kill(self.proc.pid, signal.SIGTERM)
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
        self._log.close()
        return self.proc.returncode
