"""The config file: how it is read, and what its format accepts (docs/config.md)."""

from __future__ import annotations

import os
from pathlib import Path

from migratory.config_values import ConfigError

FILE_FORMAT = (
    "The file: UTF-8, with or without a byte-order mark; LF, CRLF or CR line endings;",
    "blank lines and lines whose first non-blank character is `#` are skipped (a `#`",
    "later in a line is part of the value: `ServerName = a # b` names the server",
    "`a # b`); keys are exact (case included) and each at most once; spaces around the",
    "key and the value are dropped; the value is the rest of the line after the first",
    "`=`. An empty file sets nothing (every key keeps its default). A syntax error names",
    "the file and the line, a bad value the file and the key, a file that cannot be",
    "read (no such file, a directory, not UTF-8) the file: one line, and `migratory",
    'serve` exits 2 (README, "Starting and stopping").',
)
COMMENT_HINT = " ('#' starts a comment only at the start of a line)"
"""Added to a bad value's error when it holds a ``#``: a comment after a value is
taken as part of it (``BatchTime = 5  # ms``)."""


def read_config_file(path: str | os.PathLike[str]) -> str:
    """The file's text: UTF-8, with or without the byte-order mark some editors write;
    anything else is a :class:`ConfigError` naming the file and the line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None
