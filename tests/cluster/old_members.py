"""Members of 524f73f (the previous version) running beside members of this code.

524f73f's source comes from this repository's own history (``git archive``, its
``cluster`` and ``migratory`` packages only), unpacked once per test session; its
members run on this checkout's Python and packages (its ``pyproject.toml`` is this
one's, so its dependencies are), with its source first on the path. Every process is
one :class:`~cluster_fixture.LocalCluster` starts, stopped by its PID.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from cluster_fixture import LocalCluster

from cluster.tooling import MQTT_OFFSET, member_command

OLD_COMMIT = "524f73f"
ROOT = Path(__file__).resolve().parents[2]


def unpack_524f73f(into: Path) -> Path:
    """524f73f's ``cluster`` and ``migratory`` under ``into`` (once: kept there)."""
    tree = into / f"migratory-{OLD_COMMIT}"
    if (tree / "cluster" / "__main__.py").exists():
        return tree
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", OLD_COMMIT, "cluster", "migratory"],
        capture_output=True, check=False,
    )
    if archive.returncode != 0:
        raise RuntimeError(
            f"{OLD_COMMIT} is not in this clone's history (a shallow clone? "
            f"git fetch --unshallow): {archive.stderr.decode(errors='replace')}")
    part = into / f"{tree.name}.part"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(part, filter="data")
    part.rename(tree)
    return tree


NEWER_LOOPBACK_KEYS = frozenset({"ClusterSeedLinkWait"})
"""Keys cluster/tooling.py's ``member_settings`` gives every loopback member that 524f73f
does not know (docs/cluster.md, 'Downgrading to 524f73f'); its members go without them."""


class MixedCluster(LocalCluster):
    """A Guaranteed loopback cluster (an MQTT listener on each member's port + 5) whose
    members in :attr:`old` run 524f73f from ``old_tree``; the others this code. Move a
    member between versions by stopping it, changing :attr:`old` and starting it."""

    def __init__(self, tmp_path: Path, old_tree: Path, *, members: int, seeds: int = 3,
                 old: set[int], **extra: str) -> None:
        super().__init__(tmp_path, members=members, seeds=seeds, **extra)
        for i, settings in enumerate(self.settings):
            settings["ListenMqtt"] = f"127.0.0.1:{self.port(i) + MQTT_OFFSET}"
        self.old_tree = old_tree
        self.old = set(old)

    def start(self, index: int) -> None:
        settings = self.settings[index]
        if index in self.old:  # a key it does not know stops it at start
            settings = {k: v for k, v in settings.items() if k not in NEWER_LOOPBACK_KEYS}
        args, env = member_command(settings)
        if index in self.old:  # its source first: it shadows this checkout's
            env["PYTHONPATH"] = str(self.old_tree)
        with (self.tmp_path / f"migratory-{index}.log").open("ab") as log:
            version = OLD_COMMIT if index in self.old else "this version"
            log.write(f"--- started on {version}\n".encode())
            self.processes[index] = subprocess.Popen(
                args, cwd=self.old_tree if index in self.old else None,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
            )

    def restart(self, index: int, *, old: bool) -> None:
        """Stop member ``index`` (SIGTERM, as a rolling update does) and start it again on
        524f73f (``old``) or this version."""
        process = self.processes[index]
        if process is not None and process.poll() is None:
            self.kill(index, 15)
        (self.old.add if old else self.old.discard)(index)
        self.start(index)

    def mqtt_port(self, index: int) -> int:
        return self.port(index) + MQTT_OFFSET
