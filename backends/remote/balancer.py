"""Balancers: pick one replica among the candidates the pool offers (healthy, not yet tried).

least_request (power of two choices on outstanding / weight), round_robin, weighted (smooth
weighted round robin, nginx's) and affinity (consistent hash ring with bounded load).
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_left
from typing import Protocol

from backends.remote.replica import Replica
from backends.settings import BalancerSettings

_VNODES = 160


class Balancer(Protocol):
    def pick(self, candidates: list[Replica], key: bytes | None, now: float) -> Replica: ...


class LeastRequest:
    """P2C: two random candidates, the one with fewer outstanding requests per unit weight wins."""

    def __init__(self, slow_start_s: float, rng: random.Random | None = None) -> None:
        self._slow_start_s = slow_start_s
        self._rng = rng or random.Random()

    def _cost(self, r: Replica, now: float) -> float:
        return (r.outstanding + 1) / (r.weight * r.load_factor(now, self._slow_start_s))

    def pick(self, candidates: list[Replica], key: bytes | None, now: float) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(candidates, 2)
        return a if self._cost(a, now) <= self._cost(b, now) else b


class RoundRobin:
    def __init__(self) -> None:
        self._n = 0

    def pick(self, candidates: list[Replica], key: bytes | None, now: float) -> Replica:
        self._n += 1
        return candidates[self._n % len(candidates)]


class Weighted:
    """Smooth weighted round robin: an even spread in proportion to weight x slow-start factor."""

    def __init__(self, slow_start_s: float) -> None:
        self._slow_start_s = slow_start_s
        self._current: dict[int, float] = {}

    def pick(self, candidates: list[Replica], key: bytes | None, now: float) -> Replica:
        total = 0.0
        best: Replica | None = None
        for r in candidates:
            w = r.weight * r.load_factor(now, self._slow_start_s)
            cur = self._current.get(id(r), 0.0) + w
            self._current[id(r)] = cur
            total += w
            if best is None or cur > self._current[id(best)]:
                best = r
        assert best is not None
        self._current[id(best)] -= total
        return best


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Affinity:
    """Consistent hashing with bounded load (Google's "consistent hashing with bounded loads").

    A key walks the ring from its hash to the first candidate whose outstanding requests stay
    under load_factor x the mean, so a hot key spills to the next replica instead of swamping
    one. An ejected replica's keys move to their ring successor and come back when it returns.
    """

    def __init__(self, replicas: list[Replica], load_factor: float) -> None:
        self._load_factor = load_factor
        ring: list[tuple[int, Replica]] = []
        for r in replicas:
            for v in range(_VNODES):
                ring.append((_hash(f"{r.url}#{v}".encode()), r))
        ring.sort(key=lambda t: t[0])
        self._points = [p for p, _ in ring]
        self._owners = [r for _, r in ring]
        self._fallback = LeastRequest(0.0)

    def pick(self, candidates: list[Replica], key: bytes | None, now: float) -> Replica:
        if key is None:
            return self._fallback.pick(candidates, None, now)
        allowed = {id(r) for r in candidates}
        total = sum(r.outstanding for r in candidates) + 1
        cap = math.ceil(self._load_factor * total / len(candidates))
        start = bisect_left(self._points, _hash(key)) % len(self._points)
        first: Replica | None = None
        seen: set[int] = set()
        for i in range(len(self._points)):
            r = self._owners[(start + i) % len(self._points)]
            if id(r) not in allowed or id(r) in seen:
                continue
            seen.add(id(r))
            if first is None:
                first = r
            if r.outstanding + 1 <= cap:
                return r
            if len(seen) == len(allowed):
                break
        assert first is not None
        return first


def build_balancer(
    settings: BalancerSettings, replicas: list[Replica], slow_start_s: float
) -> Balancer:
    if settings.policy == "round_robin":
        return RoundRobin()
    if settings.policy == "weighted":
        return Weighted(slow_start_s)
    if settings.policy == "affinity":
        return Affinity(replicas, settings.load_factor)
    return LeastRequest(slow_start_s)
