"""The light workload of the chaos runs inside ``make test`` (``make chaos`` runs the
default, heavy one): every kind of client (the HTTP and MQTT
publishers too), a few subjects, about 100 publishes/s."""

from __future__ import annotations

import pytest

LIGHT_LOAD = [
    "--subjects", "10",
    "--rate", "100",
    "--publishers", "1",
    "--raw-publishers", "2",
    "--http-publishers", "1",
    "--mqtt-publishers", "1",
    "--subscribers", "3",
    "--auditors", "2",
]


@pytest.fixture(scope="session")
def light_load() -> list[str]:
    return list(LIGHT_LOAD)
