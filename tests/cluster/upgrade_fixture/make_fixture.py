"""Make ``seeds-524f73f.tar.gz``: the ClusterDataDir of 3 seeds written by migratory 524f73f.

524f73f is the code before the Raft dump held its caches as one packed ``bytes``
(cluster/dump_decoder.py), before the link's version and before MQTT session records
named their writer: the version a rolling upgrade starts from
(``tests/cluster/test_cluster_upgrade.py`` reads these bytes with the code of today).
CI cannot install that version, so its bytes are committed; this script is how they
were made, and makes them again::

    git archive 524f73f --prefix=old/ | tar -x -C /tmp
    (cd /tmp/old && python3 -m venv .venv && .venv/bin/pip install -e .)
    .venv/bin/python tests/cluster/upgrade_fixture/make_fixture.py /tmp/old

It runs 3 seeds of that checkout (its own Python, its own directory: every process
started here is stopped by its PID), with a Raft log compacted every 100 entries, and
through them: an MQTT device's persistent session (clean session 0, a filter at QoS 1),
then guaranteed publishes until every seed has a ``raft.dump``, then a few more (in
the journal, after the dump). It writes what was acknowledged, with positions, into
``expected.json`` and the seeds' data dirs (without pysyncobj's free journal space)
into the archive.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent / "server")]

from cluster_fixture import LocalCluster  # noqa: E402
from cluster_load import LoadPublisher  # noqa: E402
from paho_client import PahoClient  # noqa: E402

from cluster.tooling import member_command  # noqa: E402

SUBJECTS = ("/upgrade/a", "/upgrade/b")
DEVICE = "old-device"
FILTER = "upgrade/+"
COMPACTION_ENTRIES = 100  # (the least it takes)


class OldCluster(LocalCluster):
    """A LocalCluster whose members run the checkout at ``old`` with its own Python."""

    def __init__(self, tmp_path: Path, old: Path) -> None:
        super().__init__(tmp_path, members=3, seeds=3,
                         ClusterLogCompactionEntries=str(COMPACTION_ENTRIES),
                         ClusterLogCompactionTime="3600")  # (compacted by count)
        for i, settings in enumerate(self.settings):
            settings["ListenMqtt"] = f"127.0.0.1:{self.port(i) + 5}"
        self.old = old

    def start(self, index: int) -> None:
        args, env = member_command(self.settings[index])
        args[0] = str(self.old / ".venv" / "bin" / "python")
        env.pop("PYTHONPATH", None)
        with (self.tmp_path / f"migratory-{index}.log").open("ab") as log:
            self.processes[index] = subprocess.Popen(
                args, cwd=self.old, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=log, env=env,
            )


def publish(cluster: OldCluster, count: int, tag: str) -> LoadPublisher:
    publisher = LoadPublisher([cluster.port(0)], rate=100, duration=60,
                              subjects=SUBJECTS, tag=tag)
    publisher.start()
    try:
        publisher.wait_acked(count, 60)
    finally:
        publisher.stop()
    assert not publisher.failed and not publisher.unanswered, publisher.summary()
    return publisher


def trimmed_journal(path: Path) -> bytes:
    """pysyncobj's journal without its free space: the header's end of records is the
    file's end (it grows the file again when it appends)."""
    data = path.read_bytes()
    end = int.from_bytes(data[36:40], "little")  # (pysyncobj/journal.py: its header)
    assert 40 <= end <= len(data), (end, len(data))
    return data[:end]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path, help="a checkout of 524f73f with its .venv")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = OldCluster(Path(tmp), args.old.resolve())
        cluster.start_all()
        try:
            cluster.wait_ready(timeout=60)
            device = PahoClient(cluster.port(1) + 5, DEVICE, clean_session=False)
            assert device.subscribe(FILTER, 1) == [1]
            device.stop()
            publishers = [publish(cluster, 200, "before-dump-")]
            data = Path(tmp) / "data"
            deadline = time.monotonic() + 60
            while not all((data / f"migratory-{i}" / "raft.dump").exists() for i in range(3)):
                assert time.monotonic() < deadline, "no dump on every seed"
                publishers.append(publish(cluster, 20, f"wait-{len(publishers)}-"))
            publishers.append(publish(cluster, 10, "after-dump-"))
            time.sleep(2)  # every seed has applied the last commit
            cluster.wait_same_applied(range(3))
        finally:
            cluster.stop()
        acked: dict[str, list[list[object]]] = {s: [] for s in SUBJECTS}
        for publisher in publishers:
            for subject, messages in publisher.acked_messages().items():
                acked[subject] += [[c.decode(), p.epoch, p.seq] for c, p in messages]
        for messages in acked.values():
            messages.sort(key=lambda m: (m[1], m[2]))
        expected = {"device": DEVICE, "filter": FILTER, "acked": acked}
        (args.out / "expected.json").write_text(json.dumps(expected, separators=(",", ":")) + "\n")
        with tarfile.open(args.out / "seeds-524f73f.tar.gz", "w:gz") as archive:
            for i in range(3):
                for path in sorted((data / f"migratory-{i}").iterdir()):
                    if path.name.startswith("."):
                        continue
                    body = (trimmed_journal(path) if path.name == "raft.journal"
                            else path.read_bytes())
                    info = tarfile.TarInfo(f"migratory-{i}/{path.name}")
                    info.size = len(body)
                    archive.addfile(info, io.BytesIO(body))
        size = (args.out / "seeds-524f73f.tar.gz").stat().st_size
        print(f"{sum(map(len, acked.values()))} acknowledged; archive {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
