"""Parsers of configuration values: text in, a typed value out, ValueError naming
what was expected. Used by :mod:`migratory.config` for every setting."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Any

ORDINAL = "{ordinal}"  # in ClusterMemberTemplate: a member's index in ClusterMembers
MAX_CLUSTER_MEMBERS = 1000
"""The longest ClusterMembers (and largest ClusterMemberCount) a config may give: a bound
far above any cluster this product runs (seeds 3 or 5, a StatefulSet of a few dozen pods),
so that a typo (ClusterMemberCount = 100000000) is refused at once instead of expanding a
list for minutes while nothing listens."""


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the source."""


SHOWN_CHARACTERS = 60


def shown(text: str) -> str:
    """``text`` quoted for an error message, cut when long: a message is one line, not
    the 10 MB value or line it complains about."""
    if len(text) <= SHOWN_CHARACTERS:
        return repr(text)
    return f"{text[:SHOWN_CHARACTERS]!r}... ({len(text):,} characters)"


def clipped(message: str, text: str) -> str:
    """A parser's ``message`` about ``text`` with ``text`` (however quoted) shown cut."""
    if len(text) <= SHOWN_CHARACTERS:
        return message
    return message.replace(repr(text), shown(text)).replace(repr(text.strip()), shown(text))


@dataclass(frozen=True, slots=True)
class Setting:
    """One config key: its attribute on Config, its parser, default text and doc line."""

    key: str
    attr: str
    parse: Callable[[str], Any]
    default: str
    doc: str


CEILING = 1 << 40
"""A whole-number setting without a maximum of its own is at most this (1 TiB of bytes,
10^12 connections, subjects, messages...): past it a limit is no limit at all -- a digit
too many, or a way of turning a bound off that the key does not document (0 does, where
it may)."""
SECONDS_CEILING = 10 * 365 * 86_400
"""The same for a number of seconds: ten years."""


def _int(minimum: int, maximum: int | None = None, unit: str = "") -> Callable[[str], int]:
    if maximum is None:
        maximum = SECONDS_CEILING if unit == " of seconds" else CEILING

    def parse(text: str) -> int:
        noun = unit.removeprefix(" of ")
        bounds = f"must be >= {minimum} and <= {maximum}{f' ({noun})' if noun else ''}"
        digits = text.replace("_", "").lstrip("+-")
        if len(digits.lstrip("0")) > 30 and digits.isascii() and digits.isdigit():  # (int() refuses
            raise ValueError(f"{bounds}, got a number of {len(digits):,} digits")  # 4,300)
        try:
            if not text.isascii():  # int() would read any script's digits ('\uff12': 2)
                raise ValueError
            value = int(text.replace("_", ""), 10)
        except ValueError:
            raise ValueError(f"expected a whole number{unit}, got {text!r}") from None
        if value < minimum or value > maximum:
            raise ValueError(f"{bounds}, got {value}")
        return value

    return parse


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        for choice in choices:
            if text.lower() == choice.lower():
                return choice
        raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")

    return parse


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {text!r}")
    port = _int(0, 65535)(port_text)
    return host.strip("[]"), port


def _addresses(text: str) -> tuple[tuple[str, int], ...]:
    items = [item for item in (part.strip() for part in text.split(",")) if item]
    if not items:
        raise ValueError("expected at least one host:port")
    return tuple(parse_address(item) for item in items)


def _text(text: str) -> str:
    return text


def _optional_addresses(text: str) -> tuple[tuple[str, int], ...]:
    return _addresses(text) if text.strip() else ()


def _optional_address(text: str) -> tuple[str, int] | None:
    return parse_address(text) if text.strip() else None


def _member_template(text: str) -> str:
    if not text:
        return ""
    if ORDINAL not in text:
        raise ValueError(f"expected {ORDINAL} in the host:port template, got {text!r}")
    parse_address(text.replace(ORDINAL, "0"))
    return text


def _optional_count(text: str) -> int:
    return _int(1, MAX_CLUSTER_MEMBERS, unit=" of members")(text) if text.strip() else 0


def _optional_ordinal(text: str) -> int | None:
    return _int(0)(text) if text.strip() else None


def _gc_thresholds(text: str) -> tuple[int, int, int]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3:
        raise ValueError(f"expected three whole numbers like 20000,20,20, got {text!r}")
    first = _int(1)(parts[0])
    return first, _int(1)(parts[1]), _int(1)(parts[2])


def _seed_count(text: str) -> int:
    if not text.strip():
        return 0  # automatic: 3 for clusters of 3-4 members, 5 for 5 or more
    value = _int(0)(text)
    if value not in (3, 5):
        raise ValueError(f"must be 3 or 5 (an odd quorum), got {value}")
    return value


def _networks(text: str) -> tuple[IPv4Network | IPv6Network, ...]:
    """Comma-separated addresses or CIDR networks; empty: none (no restriction)."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            out.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"expected an IP address or CIDR network, got {item!r}") from None
    return tuple(out)
