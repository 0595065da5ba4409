"""``python -m chaos``: --duration takes seconds, or minutes and hours with a unit."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from chaos.__main__ import duration, main
from chaos.schedule import generate, to_jsonl

MESSAGE = "duration must look like 90, 90s, 5m or 1h"


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("300", 300.0),
        ("300s", 300.0),
        ("5m", 300.0),
        ("30m", 1800.0),
        ("1h", 3600.0),
        ("15", 15.0),
        ("2.5", 2.5),
        ("1.5m", 90.0),
        ("0", 0.0),
    ],
)
def test_duration_in_seconds(text: str, seconds: float) -> None:
    value = duration(text)
    assert value == seconds
    assert isinstance(value, float)


@pytest.mark.parametrize(
    "text", ["", "s", "5x", "five", "-5", "5 m", "1h30m", "1e3", "5M", "inf", "nan", "5ms"]
)
def test_bad_duration_is_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=MESSAGE):
        duration(text)


def test_replay_schedule_takes_minutes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay-schedule", "--seed", "7", "--duration", "1m"]) == 0
    assert capsys.readouterr().out == to_jsonl(generate(7, 60))


@pytest.mark.parametrize("command", ["run", "replay-schedule"])
def test_bad_duration_is_a_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = [command, "--seed", "1", "--duration", "soon"]
    if command == "run":
        args += ["--out", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert f"argument --duration: {MESSAGE}" in capsys.readouterr().err
    assert not out.exists(), "nothing started"


@pytest.mark.parametrize(
    "item,message",
    [
        ("Bogus=1", "unknown key 'Bogus'"),
        ("MaxCachedMessagesPerSubject=x", "MaxCachedMessagesPerSubject: expected a whole number"),
        ("Listen=127.0.0.1:1", "--set Listen: set by the runner itself"),
        ("ClusterPassword=x", "--set ClusterPassword: set by the runner itself"),
        ("no-equals", "expected Key=Value"),
        ("Workers=2", "Workers (from --set) = 2 with ClusterMembers (from the runner): a "
                      "cluster member runs one process"),
    ],
)
def test_a_bad_member_setting_ends_the_run_before_any_member_starts(
    item: str, message: str, tmp_path: Path
) -> None:
    args = ["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path / "r"), "--set", item]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert message in str(exit_info.value.code)
    assert not (tmp_path / "r" / "data").exists()


def test_member_settings_reach_every_member_and_the_run_record(tmp_path: Path) -> None:
    from chaos.runner import Runner

    runner = Runner(seed=1, duration=5, out=tmp_path / "r", members=4,
                    settings={"MaxCachedMessagesPerSubject": "5", "BatchTime": "20"})
    try:
        for m in runner.members:
            assert m.settings["MaxCachedMessagesPerSubject"] == "5"
            assert m.settings["BatchTime"] == "20"
            assert m.settings["ServerName"] == m.name  # the runner's own keys are kept
        assert runner.overrides == {"MaxCachedMessagesPerSubject": "5", "BatchTime": "20"}
    finally:
        runner.h.close()


def test_an_out_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """Before: a NotADirectoryError traceback from the runner's constructor."""
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "run"
    with pytest.raises(SystemExit, match=f"^chaos run: --out {out}: Not a directory$"):
        main(["run", "--seed", "1", "--duration", "1", "--out", str(out)])


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--rate", "-1", "argument --rate: must be more than 0, got -1"),
    ("--rate", "nan", "argument --rate: must be more than 0, got nan"),
    ("--subjects", "0", "argument --subjects: must be 1 or more, got 0"),
    ("--auditors", "-2", "argument --auditors: must be 0 or more, got -2"),
])
def test_a_workload_that_cannot_run_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    """Before: --rate -1 started the cluster, then the workload's arrival times ran
    backwards -- a loop without a checkpoint, deaf to Ctrl-C and SIGTERM (SIGKILL only);
    --subjects 0 a ValueError traceback."""
    with pytest.raises(SystemExit) as usage:
        main(["run", "--seed", "1", "--duration", "1", "--out", str(tmp_path / "run"),
              option, value])
    assert usage.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m chaos run: error: {message}"


def test_a_plan_refuses_a_rate_that_is_not_positive() -> None:
    from chaos.plan import plan_workload

    for rate in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="rate must be more than 0"):
            plan_workload(1, members=3, rate=rate)


@pytest.mark.parametrize(("extra", "named"), [
    (["--mqtt-subscribers", "2"], "--mqtt-subscribers (MQTT has no Standard rules"),
    (["--mqtt-publishers", "1"], "--mqtt-publishers (MQTT has no Standard rules"),
    (["--scenario", "majority-loss"], "--scenario majority-loss (Raft"),
])
def test_a_standard_run_refuses_what_it_cannot_check(
    tmp_path: Path, extra: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path / "r"),
              "--delivery-mode", "standard", *extra])
    assert str(refused.value.code).startswith("chaos run: --delivery-mode standard: not with")
    assert named in str(refused.value.code)
    assert not (tmp_path / "r" / "logs").exists()  # before any member was built


def test_a_standard_run_takes_sse_streams() -> None:
    """SSE streams carry their positions (the native rules hold them, Standard's too):
    not refused; MQTT, whose positions come from the acks, still is."""
    from chaos.__main__ import standard_refusals

    args = argparse.Namespace(mqtt_subscribers=0, mqtt_publishers=0, sse_subscribers=3,
                              scenario=["whole-restart"])
    standard_refusals(args)
    with pytest.raises(SystemExit, match="--mqtt-subscribers"):
        standard_refusals(argparse.Namespace(**{**vars(args), "mqtt_subscribers": 1}))


def test_a_standard_run_is_a_standard_cluster_without_raft_faults(tmp_path: Path) -> None:
    """Members configured Standard (no seeds' count; a data dir each, for the record of
    their lives: a drained member's next life chained, cluster/standard_lives.py), the
    run record says so, and the schedule has no Raft target or scenario: only the single
    faults of members (the whole-cluster restarts when asked for)."""
    from chaos.runner import Runner

    runner = Runner(seed=3, duration=90, out=tmp_path / "r", members=4, standard=True)
    try:
        for m in runner.members:
            assert m.settings["ClusterDeliveryMode"] == "Standard"
            assert m.settings["ClusterSeedMemberCount"] == ""
            assert m.settings["ClusterDataDir"] == str(tmp_path / "r" / "data" / m.name)
        runner.write_run(0, 1.0)
        assert json.loads((tmp_path / "r" / "run.json").read_text())["mode"] == "Standard"
        assert runner.workload.standard_mode  # its drain: Workload.drained
    finally:
        runner.h.close()
    assert runner.schedule and not any(f.scenario for f in runner.schedule)
    assert {f.target for f in runner.schedule} <= {f"migratory-{i}" for i in range(4)}
    guaranteed = generate(3, 90, members=4)
    assert any(f.scenario for f in guaranteed) and any(f.target == "leader" for f in guaranteed)
    restarts = generate(3, 90, members=4, standard=True, forced=("whole-restart",))
    assert {f.fault for f in restarts if f.scenario} == {"whole-restart"}
