"""What an operator meets first: every config error is one line naming where the bad
setting is (the file and its line, or the environment variable), the key and what it
accepts; and the files an operator may hand to ``--config`` by mistake."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from migratory.config import SETTINGS, ConfigError, load_config, parse_config_text
from migratory.config_file import MAX_FILE_BYTES


def _refusal(path: Path, content: bytes, environ: dict[str, str] | None = None) -> str:
    path.write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ=environ or {})
    message = str(refused.value)
    assert "\n" not in message and len(message) < 300, message
    return message


@pytest.mark.parametrize(("content", "expected"), [
    # before: "f.conf: BatchTime: ..." -- the key, not the line
    (b"Listen = 127.0.0.1:0\nBatchTime = fast\n",
     "f.conf:2: BatchTime: expected a whole number of milliseconds, got 'fast'"),
    (b"# ports\n\nListen = 127.0.0.1:99999\n",
     "f.conf:3: Listen: must be >= 0 and <= 65535, got 99999"),
    (b"Entitlement = Kerberos\n",
     "f.conf:1: Entitlement: expected one of None, Basic, Token, Custom, got 'Kerberos'"),
    (b"BatchTime = 5\nServerName = a\nBatchTime = 6\n",
     "f.conf:3: BatchTime is set twice (first on line 1)"),
    (b"BatchTime = 5\nBachTime = 5\n", "f.conf:2: unknown key 'BachTime' (did you mean"),
    # a rule between keys names each key's line
    (b"\nEntitlement = Basic\n", "Entitlement (from {path}:2) = Basic needs"),
])
def test_a_bad_setting_names_the_file_line_the_key_and_what_is_accepted(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "f.conf"
    message = _refusal(path, content)
    assert message.startswith(f"{tmp_path}/") or message.startswith("Entitlement"), message
    assert expected.format(path=path) in message


def test_an_environment_override_names_its_variable(tmp_path: Path) -> None:
    """Before: ``environment: BatchTime: ...`` -- which of the pod's variables?"""
    with pytest.raises(ConfigError, match=r"^environment variable MIGRATORY_CFG_BatchTime: "
                                          r"BatchTime: expected a whole number"):
        load_config(environ={"MIGRATORY_CFG_BatchTime": "fast"})
    with pytest.raises(ConfigError, match=r"^environment variable MIGRATORY_CFG_BACHTIME: "
                                          r"unknown key \(did you mean MIGRATORY_CFG_BATCHTIME"):
        load_config(environ={"MIGRATORY_CFG_BACHTIME": "5"})
    with pytest.raises(ConfigError, match=r"Entitlement \(from environment variable "
                                          r"MIGRATORY_CFG_ENTITLEMENT\) = Basic needs"):
        load_config(environ={"MIGRATORY_CFG_ENTITLEMENT": "Basic"})


def test_one_key_in_two_variables_is_refused_naming_both() -> None:
    """Keys match case-insensitively: two spellings of one key were taken silently, the
    winner being whichever the environment listed last."""
    with pytest.raises(ConfigError, match=r"^environment variable MIGRATORY_CFG_BATCHTIME: "
                                          r"BatchTime is set twice \(also by "
                                          r"MIGRATORY_CFG_BatchTime\)$"):
        load_config(environ={"MIGRATORY_CFG_BatchTime": "1", "MIGRATORY_CFG_BATCHTIME": "2"})


def test_not_utf8_after_a_byte_order_mark_names_the_right_line_and_byte(tmp_path: Path) -> None:
    """The offset of a decoding error was counted after the mark but read in the whole
    file: 3 bytes early, so another byte (0x0a) and possibly an earlier line was named."""
    message = _refusal(tmp_path / "f.conf", b"\xef\xbb\xbf\n\nServerName = caf\xe9\n")
    assert message == f"{tmp_path}/f.conf:3: not UTF-8 (byte 0xe9); save the file as UTF-8"


@pytest.mark.parametrize("inside", ["\x0c", "\x85", "\u2028", "\x1e", "\x0b"])
def test_only_lf_cr_and_crlf_end_a_line(tmp_path: Path, inside: str) -> None:
    """``str.splitlines`` also splits at a form feed, NEL, U+2028 and a few more: a value
    holding one was cut (the rest taken as a line of its own: an error naming a line
    the editor does not have), and every later line number was off by one."""
    path = tmp_path / "f.conf"
    path.write_text(f"ServerName = a{inside}b\r\nBatchTime = 5\rMaxBatchingSpace = x\n")
    with pytest.raises(ConfigError, match=r"f\.conf:3: MaxBatchingSpace: expected a whole"):
        load_config(path, environ={})
    path.write_text(f"ServerName = a{inside}b\n")
    assert load_config(path, environ={}).server_name == f"a{inside}b"


def test_a_file_larger_than_a_config_file_is_refused_unread(tmp_path: Path) -> None:
    """Before: read whole, whatever its size (``--config /dev/zero`` until memory ran
    out); now at most 1 MiB + 1 byte is read."""
    path = tmp_path / "big.conf"
    path.write_bytes(b"# a comment\n" * (MAX_FILE_BYTES // 12 + 1))
    with pytest.raises(ConfigError, match=r"^config file '.*big.conf' is larger than 1 MiB"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match=r"^config file '/dev/zero' is larger than 1 MiB"):
        load_config("/dev/zero", environ={})
    path.write_bytes(b"# a comment\n" * (MAX_FILE_BYTES // 12 - 1) + b"BatchTime = 7\n")
    assert load_config(path, environ={}).batch_time == 7


@pytest.mark.parametrize(("content", "expected"), [
    (b"x" * 200_000 + b"\n", "f.conf:1: expected 'Key = Value', got 'xxx"),
    (b"ServerName = a\nListen = " + b"h" * 200_000 + b"\n", "f.conf:2: Listen: expected host:"),
    (b"K" * 200_000 + b" = 1\n", "f.conf:1: unknown key 'KKK"),
    # int() refuses more than 4,300 digits: this was "expected a whole number"
    (b"BatchTime = " + b"9" * 5000 + b"\n",
     "f.conf:1: BatchTime: must be >= 0 and <= 10000 (milliseconds), got a number of 5,000"),
])
def test_a_huge_value_or_line_is_shown_cut(tmp_path: Path, content: bytes, expected: str) -> None:
    """Before: the whole line or value was quoted in the message (200 KB on stderr)."""
    message = _refusal(tmp_path / "f.conf", content)
    assert message.startswith(f"{tmp_path}/{expected}"), message


def test_serve_names_the_line_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_text("Listen = 127.0.0.1:0\n# batching\nBatchTime = fast\n")
    result = subprocess.run(
        [sys.executable, "-m", "cluster", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (f"migratory: configuration error: {path}:3: BatchTime: expected "
                             "a whole number of milliseconds, got 'fast'\n")


def test_an_unreadable_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """(Was right before too.) Root reads any file: then the server runs as nobody."""
    path = tmp_path / "f.conf"
    path.write_text("BatchTime = 5\n")
    path.chmod(0)
    args = [sys.executable, "-m", "cluster", "serve", "--config", str(path)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "util-linux setpriv: to run as nobody"
        args = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *args]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd="/")
    assert (done.returncode, done.stderr) == (2, "migratory: configuration error: cannot "
                                              f"read config file '{path}': Permission denied\n")


DOCS = Path(__file__).resolve().parents[1] / "docs"


def docs_config_blocks() -> list[tuple[str, str]]:
    """Every fenced block of docs/*.md that is a config file: each line a comment or a
    ``Key = Value`` of a known key (what an operator copies into migratory.conf)."""
    keys = {setting.key for setting in SETTINGS}
    blocks = []
    for page in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"^```\w*\n(.*?)^```", page.read_text(), re.S | re.M):
            lines = [line.strip() for line in block.splitlines()]
            settings = [line for line in lines if line and not line.startswith("#")]
            if settings and all(line.partition("=")[0].strip() in keys for line in settings):
                blocks.append((page.name, block))
    return blocks


def test_the_docs_config_examples_are_taken_as_written() -> None:
    """Copied into a file, each value is its key's (files aside: they are the reader's).
    Before: docs/tls.md's example set 'TlsMinimumVersion = 1.3   # default 1.2', refused
    ('#' starts a comment only at the start of a line), and docs/security.md's took
    '/etc/migratory/jwt-public.pem   # or the HS256 secret (>= 32 bytes)' as the file."""
    blocks = docs_config_blocks()
    assert len(blocks) >= 4, blocks  # (tls.md's two, security.md's two at least)
    by_key = {setting.key: setting for setting in SETTINGS}
    for page, block in blocks:
        layer = parse_config_text(block, source=page)
        for key, value in layer.values.items():
            assert "#" not in value, (layer.place(key), value)
            by_key[key].parse(value)
