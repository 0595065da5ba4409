"""``migratory serve`` (cluster/cli.py) builds its command line without the tools'
commands: a server, a cluster member or a worker starting does not import the clients,
the benchmark or the cluster tooling (about 100 modules it never uses), nor ``pub`` and
``sub`` the other tools'. Counted in modules, not seconds; ``migratory --help`` and a
command line without a known command build the whole command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# modules only the tools' commands use (pub/sub, bench, cluster up/status, dump-downgrade)
TOOLS = ("migratory.cli_client", "migratory_client", "migratory.bench.cli",
         "migratory.bench.fanout", "cluster.tooling", "cluster.up_checks")

# ``main`` as the console script runs it, the command's function (MODULE NAME, the first
# two arguments) replaced by a report of what the command line imported on the way to it
RUNS_AND_REPORTS_IMPORTS = """
import importlib
import sys
from cluster import cli

def report(args):
    print(" ".join(sorted(sys.modules)))
    return 0

setattr(importlib.import_module(sys.argv[1]), sys.argv[2], report)
sys.exit(cli.main(sys.argv[3:]))
"""


def imported_before(function: str, *argv: str) -> set[str]:
    """``function``: ``module:name`` of the command's function, run as ``argv``."""
    done = subprocess.run([sys.executable, "-c", RUNS_AND_REPORTS_IMPORTS,
                           *function.split(":"), *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_serve_imports_none_of_the_tools() -> None:
    imported = imported_before("cluster.cli:_serve", "serve", "--set", "Listen=127.0.0.1:0")
    assert "cluster.cli" in imported
    assert sorted(imported & set(TOOLS)) == []


def test_pub_imports_none_of_the_other_tools() -> None:
    """Before: every command but ``serve`` built the whole command line, so a ``pub`` (or
    a ``sub``) imported the benchmark, the cluster tooling and downgrade-dump: 0.55 s of
    CPU for the command line against 0.35 s for the client's alone (medians of 3,
    load 25)."""
    imported = imported_before("migratory.cli_client:run_pub", "pub", "/a/b", "x")
    assert "migratory_client" in imported
    others = {"migratory.bench.cli", "migratory.bench.fanout", "cluster.tooling",
              "cluster.up_checks", "cluster.dump_downgrade"}
    assert sorted(imported & others) == []


def test_the_other_commands_are_still_there() -> None:
    done = subprocess.run([sys.executable, "-m", "cluster", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ")
              and not line.startswith("     ")]
    assert listed == ["serve", "pub", "sub", "bench", "cluster", "downgrade-dump"], listed
    serve = subprocess.run([sys.executable, "-m", "cluster", "serve", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert serve.returncode == 0 and "--set Key=Value" in serve.stdout, serve.stdout


# ``serve``'s build of a server alone (no ClusterMembers), then the modules it imported
BUILDS_A_SERVER_ALONE = """
import sys
from cluster.members import build_node
from migratory.config import load_config, parse_set_options

server, roles = build_node(load_config(None, overrides=parse_set_options(["Listen=127.0.0.1:0"])))
assert roles == []
print(" ".join(sorted(sys.modules)))
"""


def test_a_server_alone_imports_none_of_the_cluster() -> None:
    """``cluster.node`` (the Guaranteed member: Raft, pysyncobj, the links) is imported
    only for a Guaranteed member: a server alone paid ~258M instructions for it, a fifth
    of its start-up imports."""
    done = subprocess.run([sys.executable, "-c", BUILDS_A_SERVER_ALONE], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = set(done.stdout.split())
    assert "migratory.server.app" in imported
    assert sorted(m for m in imported if m.split(".")[0] in {"cluster", "pysyncobj"}) == [
        "cluster", "cluster.members"], imported


# ``serve``'s build of a Guaranteed member, member ARGV[1] of 3 seeds and a non-seed (its
# Raft files would go in ARGV[2])
BUILDS_A_MEMBER = """
import sys
from cluster.members import build_node
from migratory.config import load_config, parse_set_options

index = int(sys.argv[1])
members = [f"127.0.0.1:{29000 + 10 * i}" for i in range(4)]
settings = [f"Listen=127.0.0.1:{28000 + 10 * index}", "ClusterMembers=" + ",".join(members),
            f"ClusterMemberListen={members[index]}", "ClusterSeedMemberCount=3",
            "ClusterDeliveryMode=Guaranteed", "ClusterPassword=test-cluster-password",
            f"ClusterDataDir={sys.argv[2]}"]
server, roles = build_node(load_config(None, overrides=parse_set_options(settings)))
print(type(roles[0]).__name__, roles[0].is_seed, "pysyncobj" in sys.modules)
"""


@pytest.mark.parametrize(("index", "said"), [(0, "GuaranteedNode True True"),
                                             (3, "GuaranteedNode False False")])
def test_only_a_seed_imports_raft(tmp_path: Path, index: int, said: str) -> None:
    """A non-seed never runs Raft: it builds without cluster.seed (pysyncobj, the Raft
    files, cryptography: 91 modules)."""
    done = subprocess.run([sys.executable, "-c", BUILDS_A_MEMBER, str(index), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == said, done.stdout
