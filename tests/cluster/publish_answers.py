"""The publish answers a client of ClusterPublishing receives, recorded (test helper)."""

from __future__ import annotations

from migratory.protocol import ops


class Answers:
    def __init__(self) -> None:
        self.results: list[ops.PublishStatus] = []

    def publish_result(self, status: ops.PublishStatus) -> None:
        self.results.append(status)

    def flush(self) -> None:
        pass

    @property
    def reasons(self) -> list[str | None]:
        return [r.reason for r in self.results]
