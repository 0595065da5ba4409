"""The config file: how it is read, and what its format accepts (docs/config.md)."""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from migratory.config_values import ConfigError, shown

MAX_FILE_BYTES = 1 << 20
"""A config file is at most 1 MiB (a 1,000-member ClusterMembers list is ~25 KB): past
it the file is not a config file (a log, a core dump, ``--config /dev/zero``, which was
read until the machine ran out of memory)."""
FILE_FORMAT = (
    "The file: UTF-8, with or without a byte-order mark; LF, CRLF or CR line endings",
    "(nothing else ends a line: a form feed or U+2028 in a value stays in it, so the line",
    "numbers are the editor's); at most 1 MiB; blank lines and lines whose first",
    "non-blank character is `#` are skipped (a `#` later in a line is part of the value:",
    "`ServerName = a # b` names the server `a # b`); keys are exact (case included) and",
    "each at most once; spaces around the key and the value are dropped; the value is the",
    'rest of the line after the first `=`, quotes included (`Listen = "a:1"` is refused',
    'saying so; `ServerName = "a"` names the server `"a"`). An empty file sets nothing',
    "(every key keeps its default). Every error names the file and the line (a bad value:",
    "its key too, and what the key accepts; an environment variable is named instead of a",
    "line), a file that cannot be read (no such file, a directory, not UTF-8, too large)",
    'the file: one line, and `migratory serve` exits 2 (README, "Starting and stopping").',
)
COMMENT_HINT = " ('#' starts a comment only at the start of a line)"
"""Added to a bad value's error when it holds a ``#``: a comment after a value is
taken as part of it (``BatchTime = 5  # ms``)."""
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Layer:
    """One source of settings (a file, the environment, ``--set``): ``Key -> text``,
    and where each key was set when that says more than the source (a file's
    ``path:line``, an environment variable's name)."""

    source: str
    values: Mapping[str, str]
    places: Mapping[str, str] = field(default_factory=dict)

    def place(self, key: str) -> str:
        return self.places.get(key, self.source)


def read_config_file(path: str | os.PathLike[str]) -> str:
    """The file's text: UTF-8, with or without the byte-order mark some editors write;
    anything else is a :class:`ConfigError` naming the file (and the line)."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"config file {str(path)!r} is larger than 1 MiB: not a config file")
    body = data[len(codecs.BOM_UTF8):] if data.startswith(codecs.BOM_UTF8) else data
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:  # (offsets in ``body``: after the mark)
        line = len(_LINE_END.findall(body[: exc.start].decode("utf-8"))) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 (byte 0x{body[exc.start]:02x}); save the file as UTF-8"
        ) from None


def parse_config_text(text: str, *, source: str) -> Layer:
    """``Key = Value`` lines (``#`` starts a comment line) as a layer whose places are
    ``source:line``; the keys are checked against the settings when the layers merge."""
    values: dict[str, str] = {}
    places: dict[str, str] = {}
    for number, line in enumerate(_LINE_END.split(text), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        key, where = key.strip(), f"{source}:{number}"
        if not sep or not key:
            raise ConfigError(f"{where}: expected 'Key = Value', got {shown(stripped)}")
        if key in values:
            first = places[key].rpartition(":")[2]
            raise ConfigError(f"{where}: {key} is set twice (first on line {first})")
        values[key], places[key] = value.strip(), where
    return Layer(source, values, places)
