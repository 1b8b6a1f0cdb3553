"""The instances a router knows: each registers (and heartbeats) with its role, URL and KV address,
and is forgotten after `ttl_s` without a heartbeat or on a failed connect. Picks go by load: the
fewest requests the router has in flight there. Used on the router's event loop only."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ROLES = ("prefill", "decode", "mixed")
HEARTBEAT_TTL_S = 3.0
# An instance forgotten for a failure ignores its own registrations this long: a heartbeat it sent
# just before it died must not bring it back.
QUARANTINE_S = 2.0


@dataclass
class Instance:
    role: str
    url: str
    kv_address: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    in_flight: int = 0

    def describe(self) -> dict:
        return {
            "role": self.role,
            "url": self.url,
            "kv_address": self.kv_address,
            "in_flight": self.in_flight,
        }


class Registry:
    def __init__(self, ttl_s: float = HEARTBEAT_TTL_S, quarantine_s: float = QUARANTINE_S):
        self.ttl_s = ttl_s
        self.quarantine_s = quarantine_s
        self._instances: dict[str, Instance] = {}
        self._quarantine: dict[str, float] = {}  # url -> until (monotonic)

    def register(self, role: str, url: str, kv_address: str = "") -> Instance | None:
        url = url.rstrip("/")
        if self._quarantine.get(url, 0.0) > time.monotonic():
            return None
        self._quarantine.pop(url, None)
        inst = self._instances.get(url)
        if inst is None or inst.role != role:
            inst = self._instances[url] = Instance(role, url, kv_address)
        inst.kv_address = kv_address
        inst.last_seen = time.monotonic()
        return inst

    def forget(self, inst: Instance) -> None:
        """After a failed call: gone until it registers again once the quarantine is over."""
        if self._instances.get(inst.url) is inst:
            del self._instances[inst.url]
            self._quarantine[inst.url] = time.monotonic() + self.quarantine_s

    def is_alive(self, inst: Instance) -> bool:
        self._expire()
        return self._instances.get(inst.url) is inst

    def live(self, role: str | None = None) -> list[Instance]:
        self._expire()
        return [i for i in self._instances.values() if role is None or i.role == role]

    def pick(self, role: str, exclude: set[str] = frozenset()) -> Instance | None:
        """The live instance of `role` with the fewest requests in flight (ties: the first registered)."""
        choices = [i for i in self.live(role) if i.url not in exclude]
        return min(choices, key=lambda i: i.in_flight) if choices else None

    def _expire(self) -> None:
        now = time.monotonic()
        for url in [u for u, i in self._instances.items() if now - i.last_seen > self.ttl_s]:
            del self._instances[url]
