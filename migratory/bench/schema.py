"""The JSON schema of ``migratory bench --json FILE`` (schema 1): what a reader may rely on.

Every result has its target, its pattern, what was counted against what was
expected, latency percentiles in ms (empty for idle connections) with the 0.1 ms
histogram they come from, and the verdict. Each pattern adds its own details.
"""

from __future__ import annotations

from typing import Any

_MS = {"type": "number"}
_MS_OR_NONE = {"type": ["number", "null"]}  # null: no value (no delivery, no ack)

RESULT: dict[str, Any] = {
    "type": "object",
    "required": ["target", "pattern", "counted", "expected", "latency_ms", "hist", "pass",
                 "all_delivered", "machine", "cpu_percent"],
    "properties": {
        "target": {
            "type": "object",
            "required": ["name", "url"],
            "properties": {"name": {"type": "string"},
                           "url": {"type": "string", "pattern": "^(ws|mqtt)://"}},
        },
        "pattern": {"enum": ["fan-out", "many-subjects", "publish-with-ack",
                             "idle-connections"]},
        "counted": {"type": "integer", "minimum": 0},
        "expected": {"type": "integer", "minimum": 0},
        "latency_ms": {
            "type": "object",
            "properties": {key: _MS_OR_NONE for key in ("p50", "p90", "p99", "p99.9", "max")},
            "additionalProperties": False,
        },
        # 0.1 ms bucket index (a string in JSON) -> count
        "hist": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
        "messages_per_second": _MS,
        "kib_per_connection": {"type": ["number", "null"]},
        "server_cpu_us_per_delivery": {"type": ["number", "null"]},
        "load_cpu_us_per_delivery": {"type": ["number", "null"]},
        "swarm": {"enum": ["c", "python", None]},  # the subscribers: C swarm or Python
        "pass": {"type": "boolean"},
        "all_delivered": {"type": "boolean"},
        "machine": {"type": "object", "required": ["nproc", "cpu"]},
        "cpu_percent": {"type": "object", "additionalProperties": _MS},
    },
}

FILE: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema", "results"],
    "properties": {"schema": {"const": 1}, "results": {"type": "array", "items": RESULT}},
}
