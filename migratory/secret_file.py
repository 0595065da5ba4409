"""A secret read from a file only its owner can read: ``cluster up --password-file``,
``pub``/``sub --token-file``. A secret given as an option sits on the command line,
where every user of the machine reads it (``ps``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["SecretFileError", "read_secret_file"]


class SecretFileError(ValueError):
    """The file cannot give the secret; the message names the option and the file."""


def read_secret_file(option: str, name: str) -> str:
    """The secret in ``name`` (surrounding white space stripped), given as ``option``:
    refused when the file cannot be read, is empty, or other users can read it (mode
    0600 or stricter)."""
    path = Path(name)
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"{option} {path}: {getattr(exc, 'strerror', exc)}") from None
    if mode & 0o077:
        raise SecretFileError(
            f"{option} {path} can be read by other users (mode {mode:04o}); chmod 600 {path}"
        )
    if not text:
        raise SecretFileError(f"{option} {path} is empty")
    return text
