"""Load for the simulator: creates, updates and deletes objects at a chosen rate and mix.

The demo, the benchmarks and the soak tests need a cluster that changes like a real one: a population
of Pods (by default) kept near a target size, spread over namespaces, with updates that touch metadata,
spec and status in realistic proportions. The generator drives :class:`~bridge.sim.store.ObjectStore`
directly (no HTTP), so the simulator's watchers see the changes exactly as if clients had made them.
Time comes from an injected clock; pacing is by batches so high rates do not need one sleep per event.
"""

from __future__ import annotations

import asyncio
import enum
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.clock import Clock, RealClock
from bridge.sim.objects import make_pod, mutate_pod_labels, mutate_pod_spec, mutate_pod_status
from bridge.sim.status import SimStatusError
from bridge.sim.store import ObjectStore

KubeObject = dict[str, Any]
"""The simulator's objects: JSON dicts it owns and changes (the bridge's objects are read-only)."""

__all__ = ["ChurnGenerator", "ChurnMix", "ChurnOp", "ChurnStats", "ObjectFactory"]

ObjectFactory = Callable[[str, str, "int | None", random.Random], KubeObject]
"""(name, namespace, size_bytes, rng) → an object ready to create (``make_pod``'s signature)."""

_MAX_TICK = 0.05
"""Longest single sleep, so :meth:`ChurnGenerator.stop` takes effect quickly."""
_MAX_BATCH = 500
"""Most events made between two yields to the loop, so watchers and HTTP keep being served."""


class ChurnOp(enum.StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class ChurnMix:
    """Relative weights of the three operations."""

    create: float = 1.0
    update: float = 3.0
    delete: float = 1.0

    def __post_init__(self) -> None:
        weights = (self.create, self.update, self.delete)
        if any(w < 0 or math.isnan(w) for w in weights) or sum(weights) <= 0:
            raise ValueError(f"churn mix weights must be >= 0 and not all zero, got {weights}")

    @classmethod
    def parse(cls, value: ChurnMix | Mapping[str, float] | Sequence[float] | str) -> ChurnMix:
        """Accepts a ChurnMix, ``{"create": 1, ...}``, ``(create, update, delete)`` or
        ``"create=1,update=3,delete=1"``."""
        if isinstance(value, ChurnMix):
            return value
        if isinstance(value, str):
            parts: dict[str, float] = {}
            for item in value.split(","):
                key, sep, number = item.partition("=")
                if not sep:
                    raise ValueError(f"churn mix item {item!r} must look like create=1")
                parts[key.strip()] = float(number)
            value = parts
        if isinstance(value, Mapping):
            unknown = set(value) - {"create", "update", "delete"}
            if unknown:
                raise ValueError(f"unknown churn mix operation(s): {sorted(unknown)}")
            return cls(**{k: float(v) for k, v in value.items()})
        create, update, delete = (float(v) for v in value)
        return cls(create, update, delete)


@dataclass(slots=True)
class ChurnStats:
    """What the generator did (successful operations only)."""

    created: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: int = 0
    """Operations that made no event: refused by the store (an object changed behind the generator's
    back) or updates that changed nothing."""
    by_kind: dict[str, int] = field(default_factory=dict)
    """Updates per kind: labels, spec, status."""

    @property
    def total(self) -> int:
        return self.created + self.updated + self.deleted


class ChurnGenerator:
    """Keeps a population of objects changing at ``rate`` events per second.

    ``objects`` is the target population: a create drawn while the population is at the target becomes
    an update, and an update or delete drawn while it is empty becomes a create. Updates are 60 %
    status (status subresource), 30 % labels/annotations and 10 % spec changes.
    """

    def __init__(
        self,
        *,
        store: ObjectStore,
        rate: float = 100.0,
        mix: ChurnMix | Mapping[str, float] | Sequence[float] | str = ChurnMix(),
        objects: int = 100,
        object_size: int | None = None,
        namespaces: Sequence[str] = ("default",),
        seed: int | None = None,
        resource: str = "pods",
        factory: ObjectFactory = make_pod,
        clock: Clock | None = None,
        name_prefix: str = "churn",
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive (events per second)")
        if objects < 1:
            raise ValueError("objects (the target population) must be at least 1")
        if not namespaces:
            raise ValueError("at least one namespace is needed")
        self.store = store
        self.rate = float(rate)
        self.mix = ChurnMix.parse(mix)
        self.objects = objects
        self.object_size = object_size
        self.namespaces = tuple(namespaces)
        self.resource = store.resolve(resource)
        self.factory = factory
        self.stats = ChurnStats()
        self._rng = random.Random(seed)
        self._clock: Clock = clock or RealClock()
        self._prefix = name_prefix
        self._serial = 0
        self._live: list[tuple[str, str]] = []
        """(namespace, name) of the objects the generator created and has not deleted."""
        self._index: dict[tuple[str, str], int] = {}
        self._stopped = False
        for ns in self.namespaces:
            exists = store.list("namespaces", field_selector=f"metadata.name={ns}")
            if self.resource.namespaced and not exists:
                store.create("namespaces", {"metadata": {"name": ns}})

    @property
    def population(self) -> int:
        return len(self._live)

    def stop(self) -> None:
        """Makes :meth:`run` return after the current batch."""
        self._stopped = True

    def prefill(self) -> int:
        """Creates objects until the population reaches the target; returns how many were made.
        These count in ``stats.created``."""
        made = 0
        while len(self._live) < self.objects:
            if self._create():
                made += 1
        return made

    # ------------------------------------------------------------------ one operation

    def _track(self, key: tuple[str, str]) -> None:
        self._index[key] = len(self._live)
        self._live.append(key)

    def _untrack(self, key: tuple[str, str]) -> None:
        idx = self._index.pop(key)
        last = self._live.pop()
        if idx < len(self._live):
            self._live[idx] = last
            self._index[last] = idx

    def _create(self) -> bool:
        self._serial += 1
        ns = self._rng.choice(self.namespaces) if self.resource.namespaced else ""
        name = f"{self._prefix}-{self._serial:08d}"
        obj = self.factory(name, ns or "default", self.object_size, self._rng)
        try:
            self.store.create(self.resource, obj, namespace=ns or None, copy=False)
        except SimStatusError:
            self.stats.skipped += 1
            return False
        self._track((ns, name))
        self.stats.created += 1
        return True

    def _update(self) -> bool:
        key = self._rng.choice(self._live)
        ns, name = key
        roll = self._rng.random()
        try:
            current = self.store.get_raw(self.resource, name, ns or None)
            if roll < 0.6 and self.resource.has_status:
                kind, patch, sub = "status", mutate_pod_status(current, self._rng), "status"
            elif roll < 0.9:
                kind, patch, sub = "labels", mutate_pod_labels(current, self._rng), None
            else:
                kind, patch, sub = "spec", mutate_pod_spec(current, self._rng), None
            after = self.store.patch(self.resource, name, patch, namespace=ns or None, subresource=sub,
                                     copy=False)
        except SimStatusError:
            self._forget(key)
            return False
        if after["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]:
            self.stats.skipped += 1  # the patch changed nothing: no event
            return False
        self.stats.updated += 1
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        return True

    def _delete(self) -> bool:
        key = self._rng.choice(self._live)
        try:
            self.store.delete(self.resource, key[1], namespace=key[0] or None, copy=False)
        except SimStatusError:
            self._forget(key)
            return False
        self._untrack(key)
        self.stats.deleted += 1
        return True

    def _forget(self, key: tuple[str, str]) -> None:
        # Someone else deleted it: stop tracking and count the lost operation.
        self.stats.skipped += 1
        if key in self._index:
            self._untrack(key)

    def step(self) -> ChurnOp:
        """Performs one operation now and returns which one was drawn (after population rules)."""
        mix = self.mix
        op = self._rng.choices((ChurnOp.CREATE, ChurnOp.UPDATE, ChurnOp.DELETE),
                               weights=(mix.create, mix.update, mix.delete))[0]
        if not self._live:
            op = ChurnOp.CREATE
        elif op is ChurnOp.CREATE and len(self._live) >= self.objects:
            op = ChurnOp.UPDATE
        if op is ChurnOp.CREATE:
            self._create()
        elif op is ChurnOp.UPDATE:
            self._update()
        else:
            self._delete()
        return op

    # ------------------------------------------------------------------ pacing

    async def run(self, duration: float | None = None, max_events: int | None = None) -> ChurnStats:
        """Generates events at ``rate`` until ``duration`` seconds passed, ``max_events`` were made,
        or :meth:`stop` was called (whichever first; with neither limit, until stopped)."""
        self._stopped = False
        clock = self._clock
        start = clock.now()
        done = 0
        while not self._stopped:
            if max_events is not None and done >= max_events:
                break
            elapsed = clock.now() - start
            if duration is not None and elapsed >= duration:
                break
            due = math.floor(elapsed * self.rate) + 1 - done
            if due <= 0:
                wait = (done + 1) / self.rate - elapsed
                if duration is not None:
                    wait = min(wait, duration - elapsed)
                await clock.sleep(min(_MAX_TICK, max(wait, 0.0)))
                continue
            batch = min(due, _MAX_BATCH)
            if max_events is not None:
                batch = min(batch, max_events - done)
            for _ in range(batch):
                self.step()
            done += batch
            await asyncio.sleep(0)
        return self.stats

    def describe(self) -> dict[str, Any]:
        return {"rate": self.rate, "population": self.population, "target": self.objects,
                "created": self.stats.created, "updated": self.stats.updated, "deleted": self.stats.deleted,
                "skipped": self.stats.skipped}
