"""What a kubelet keeps for one probe of one container: the run of equal results, and
the probe's state, which changes only after ``failureThreshold`` failures (or
``successThreshold`` successes) in a row. A readiness probe starts failed; a probe
with no answer within ``timeoutSeconds`` is a failure (Kubernetes' "Configure
Liveness, Readiness and Startup Probes"). Pure: the local StatefulSet's kubelet
(k8s_local.py) and the probe tests feed it results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ProbeState:
    failure_threshold: int = 3  # the API's defaults
    success_threshold: int = 1
    passing: bool = False
    run: int = 0  # results in a row that disagree with ``passing``

    @classmethod
    def of(cls, probe: dict[str, Any]) -> ProbeState:
        return cls(int(probe.get("failureThreshold", 3)), int(probe.get("successThreshold", 1)))

    def observe(self, ok: bool) -> bool:
        """One probe's result; the probe's state after it."""
        if ok == self.passing:
            self.run = 0
            return self.passing
        self.run += 1
        if self.run >= (self.success_threshold if ok else self.failure_threshold):
            self.passing, self.run = ok, 0
        return self.passing
