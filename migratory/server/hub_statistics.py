"""The hub's figures at one moment (``Hub.statistics``: /stats, /metrics)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HubStatistics"]


@dataclass(frozen=True, slots=True)
class HubStatistics:
    subjects: int
    subscriptions: int
    messages_published: int
    frames_fanned_out: int
    cached_messages: int
    cache_bytes: int  # what the caches count against CacheMemoryBudget (0: no budget)
    cache_evicted: int  # cached messages CacheMemoryBudget dropped so far
    subjects_forgotten: int  # spent subjects forgotten so far (see Hub.expire)
    # messages of a subject with '+' or '#' no MQTT wildcard filter was matched against
    mqtt_unnamable_messages: int = 0
