"""Whatever a config file or the MIGRATORY_CFG_* environment holds, loading it gives a
Config or one ConfigError line naming the key, the file's line or the variable -- never
another exception (``migratory serve`` prints the line and exits 2; test_config.py runs
that). And the file shapes an editor or an operator produces (docs/config.md says what
the parser accepts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migratory.config import SETTINGS, ConfigError, load_config

KEYS = [s.key for s in SETTINGS]
VALUES = st.one_of(
    st.sampled_from([s.default for s in SETTINGS]),
    st.text(max_size=30),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from([
        "true", "0", "-1", "1e3", "0x10", "127.0.0.1:0", "[::1]:0", "a:b:c", "::",
        "0.0.0.0:99999", "Guaranteed", "Standard", "Custom", "Token", "Basic", "nan",
        " ", "\t", "\x85", "\u2028", "5 # comment", "/nonexistent/x", "a.b:C",
        "127.0.0.1:9000,127.0.0.1:9010,127.0.0.1:9020", "127.0.0.1:9010",
        "migratory-{ordinal}:9000", "3", "5",
    ]),
    st.lists(st.sampled_from(["127.0.0.1:0", "h:2", "", " ", "x"]), max_size=4).map(",".join),
)
LINES = st.one_of(
    st.tuples(st.sampled_from(KEYS), st.sampled_from([" = ", "=", "\t=\t"]), VALUES).map(
        "".join),
    st.text(max_size=40),
    st.sampled_from(["#", "# Listen = x", "", "   ", "=", "= x", "\ufeffListen = 1"]),
)
FILES = st.tuples(st.lists(LINES, max_size=8), st.sampled_from(["\n", "\r\n", "\r"])).map(
    lambda lines_and_end: lines_and_end[1].join(lines_and_end[0]))
ENVIRONMENTS = st.dictionaries(
    st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=10)).map(
        lambda key: "MIGRATORY_CFG_" + key),
    VALUES.filter(lambda value: "\0" not in value),  # (no NUL in a real environment)
    max_size=3,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(FILES, ENVIRONMENTS)
def test_any_file_and_environment_give_a_config_or_one_line_naming_the_key(
    text: str, environ: dict[str, str]
) -> None:
    try:
        load_config("f.conf", text=text, environ=environ)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, message
        assert ("f.conf:" in message or "MIGRATORY_CFG_" in message
                or any(key in message for key in KEYS)), message


@pytest.mark.parametrize(("content", "message"), [
    (b"Listen = 127.0.0.1:0\nListen = 127.0.0.1:1\n",
     r"f.conf:2: Listen is set twice \(first on line 1\)$"),
    (b"BatchTime = 5 # ms\n",
     r"f.conf:1: BatchTime: expected a whole number of milliseconds, got '5 # ms' "
     r"\('#' starts a comment only at the start of a line\)$"),
    (b"Listen\n", r"f.conf:1: expected 'Key = Value', got 'Listen'$"),
    # before: '... got '8817"'' and no more, the quotes taken for the value's
    (b'Listen = "127.0.0.1:8817"\n', r"f.conf:1: Listen: expected a whole number, got "
     r"'8817\"' \(a value is not quoted: Listen = 127.0.0.1:8817\)$"),
    (b"Entitlement = 'Basic'\n", r"f.conf:1: Entitlement: expected one of None, Basic, "
     r"Token, Custom, got \"'Basic'\" \(a value is not quoted: Entitlement = Basic\)$"),
    (b"listen = 127.0.0.1:0\n", r"f.conf:1: unknown key 'listen' \(did you mean 'Listen'\?\)$"),
    (b"ServerName = caf\xe9\n", r"f.conf:1: not UTF-8 \(byte 0xe9\)"),
])
def test_a_bad_file_is_one_line_naming_the_line_or_the_key(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "f.conf").write_bytes(content)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(tmp_path))}/{message}"):
        load_config(tmp_path / "f.conf", environ={})


def test_an_unknown_variable_is_named_in_one_line() -> None:
    """Before: the variable's name as it was, a newline in it (any byte but NUL and '='
    may be in one) made the message two lines."""
    with pytest.raises(ConfigError, match=r"^environment variable 'MIGRATORY_CFG_\\nListen': "
                                          r"unknown key \(did you mean MIGRATORY_CFG_LISTEN\?\)$"):
        load_config(environ={"MIGRATORY_CFG_\nListen": "127.0.0.1:0"})


def test_what_the_parser_accepts(tmp_path: Path) -> None:
    """A byte-order mark, CRLF endings, spaces and tabs around the key and the value,
    comment lines, and a # inside a text value (its part: docs/config.md)."""
    path = tmp_path / "f.conf"
    path.write_bytes(b"\xef\xbb\xbf# a comment\r\n\r\n  Listen\t=  127.0.0.1:9100  \r\n"
                     b"   # another\r\nServerName = a # b\r\n")
    config = load_config(path, environ={})
    assert config.listen == (("127.0.0.1", 9100),)
    assert config.server_name == "a # b"
    (tmp_path / "empty.conf").write_bytes(b"")
    assert load_config(tmp_path / "empty.conf", environ={}) == load_config(environ={})


def test_a_file_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cannot read config file '.*': Is a directory$"):
        load_config(tmp_path, environ={})
    with pytest.raises(ConfigError, match=r"^cannot read config file '.*': No such file"):
        load_config(tmp_path / "none.conf", environ={})
