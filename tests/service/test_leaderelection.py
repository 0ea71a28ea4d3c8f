"""Leader election semantics, driven by a fake clock over an in-memory Lease store."""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import pytest

from bridge.clock import FakeClock
from bridge.errors import ApiUnavailableError, ConflictError, NotFoundError, status_error
from bridge.kube.leaderelection import LeaderElector

PATH = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/keb"


class FakeLeases:
    """Lease CRUD with optimistic concurrency, like the API server; can be made unreachable."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.down_for: set[str] = set()  # identities whose requests fail (network partition)
        self.caller = ""

    def _check(self) -> None:
        if self.caller in self.down_for:
            raise ApiUnavailableError("partitioned")

    async def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]:
        self._check()
        if path not in self.objects:
            raise status_error(404, {"reason": "NotFound"})
        return copy.deepcopy(self.objects[path])

    async def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self._check()
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise status_error(409, {"reason": "AlreadyExists"})
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[full] = obj
        return copy.deepcopy(obj)

    async def replace(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self._check()
        cur = self.objects[path]
        if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise status_error(409, {"reason": "Conflict"})
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[path] = obj
        return copy.deepcopy(obj)

    def spec(self) -> dict[str, Any]:
        return dict(self.objects[PATH]["spec"])


class Bound:
    """The fake store as seen by one candidate (so partitions can target it)."""

    def __init__(self, store: FakeLeases, identity: str) -> None:
        self.store = store
        self.identity = identity

    async def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]:
        self.store.caller = self.identity
        return await self.store.get(path)

    async def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.store.caller = self.identity
        return await self.store.create(path, body)

    async def replace(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.store.caller = self.identity
        return await self.store.replace(path, body)


class Candidate:
    def __init__(self, store: FakeLeases, clock: FakeClock, identity: str) -> None:
        self.events: list[str] = []
        self.working = asyncio.Event()
        self.elector = LeaderElector(
            client=Bound(store, identity), namespace="ops", name="keb", identity=identity,
            on_started_leading=self._work, on_stopped_leading=lambda: self.events.append("stopped"),
            on_new_leader=lambda who: self.events.append(f"leader={who}"),
            lease_duration=15, renew_deadline=10, retry_period=2, clock=clock, rng=random.Random(1),
        )
        self.task = asyncio.create_task(self.elector.run(), name=f"elector-{identity}")

    async def _work(self) -> None:
        self.events.append("started")
        self.working.set()
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.elector.stop()
        await self.task


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_first_candidate_creates_the_lease_and_leads() -> None:
    store, clock = FakeLeases(), FakeClock()
    a = Candidate(store, clock, "a")
    await settle()
    assert a.elector.is_leader()
    assert a.events == ["leader=a", "started"]
    spec = store.spec()
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    await a.stop()
    assert a.events[-1] == "stopped"


async def test_standby_waits_then_takes_over_after_expiry_measured_locally() -> None:
    store, clock = FakeLeases(), FakeClock()
    a = Candidate(store, clock, "a")
    await settle()
    b = Candidate(store, clock, "b")
    await settle()
    assert not b.elector.is_leader()
    assert b.events == ["leader=a"]
    # The leader is partitioned away: it can no longer renew.
    store.down_for.add("a")
    # b saw the record change at its last renewal; 15 s of no change must pass on b's clock.
    for _ in range(7):
        await clock.advance(2)
        await settle()
        assert not b.elector.is_leader()
    for _ in range(6):
        await clock.advance(2)
        await settle()
    assert b.elector.is_leader()
    assert "started" in b.events
    spec = store.spec()
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    # a gave up once it could not renew within its 10 s renew deadline.
    assert not a.elector.is_leader()
    assert a.events[-1] == "stopped"
    await a.task
    await b.stop()


async def test_leader_loses_leadership_after_renew_deadline() -> None:
    store, clock = FakeLeases(), FakeClock()
    a = Candidate(store, clock, "a")
    await settle()
    await clock.advance(2)  # one successful renewal
    await settle()
    store.down_for.add("a")
    await clock.advance(8)
    await settle()
    assert a.elector.is_leader()  # still within the renew deadline
    for _ in range(4):
        await clock.advance(2)
        await settle()
    assert not a.elector.is_leader()
    assert a.events == ["leader=a", "started", "stopped"]
    await a.task


async def test_release_on_stop_hands_over_at_once() -> None:
    store, clock = FakeLeases(), FakeClock()
    a = Candidate(store, clock, "a")
    await settle()
    b = Candidate(store, clock, "b")
    await settle()
    await a.stop()
    spec = store.spec()
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    # b's next retry (at most 2 * 2.2 s with jitter) acquires without waiting out 15 s.
    await clock.advance(5)
    await settle()
    assert b.elector.is_leader()
    assert store.spec()["leaseTransitions"] == 1
    await b.stop()


async def test_stopped_leading_called_even_without_leadership() -> None:
    store, clock = FakeLeases(), FakeClock()
    a = Candidate(store, clock, "a")
    await settle()
    b = Candidate(store, clock, "b")
    await settle()
    await b.stop()
    assert b.events == ["leader=a", "stopped"]
    await a.stop()


async def test_conflicting_writes_do_not_make_two_leaders() -> None:
    store, clock = FakeLeases(), FakeClock()
    cands = [Candidate(store, clock, name) for name in "abc"]
    for _ in range(5):
        await clock.advance(2)
        await settle()
        assert sum(c.elector.is_leader() for c in cands) == 1
    for c in cands:
        await c.stop()


@pytest.mark.parametrize(
    ("lease", "renew", "retry"), [(10, 10, 2), (15, 2, 2), (15, 10, 9)],
)
def test_invalid_durations_rejected(lease: float, renew: float, retry: float) -> None:
    async def work() -> None:
        return None

    with pytest.raises(ValueError, match="must be greater"):
        LeaderElector(client=FakeLeases(), namespace="n", name="l", identity="a", on_started_leading=work,
                      lease_duration=lease, renew_deadline=renew, retry_period=retry)


def test_error_types_used_by_the_fake_match_the_real_mapping() -> None:
    assert isinstance(status_error(404, {}), NotFoundError)
    assert isinstance(status_error(409, {}), ConflictError)


class HangingLeases(FakeLeases):
    """Requests from the identities in ``hung`` never get an answer (until cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.hung: set[str] = set()
        self.timeouts: list[float | None] = []

    def _check(self) -> None:
        super()._check()

    async def _maybe_hang(self, timeout: float | None) -> None:
        self.timeouts.append(timeout)
        if self.caller in self.hung:
            await asyncio.Event().wait()


class HangingBound(Bound):
    store: HangingLeases

    async def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]:
        self.store.caller = self.identity
        await self.store._maybe_hang(timeout)
        return await self.store.get(path)

    async def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.store.caller = self.identity
        await self.store._maybe_hang(timeout)
        return await self.store.create(path, body)

    async def replace(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.store.caller = self.identity
        await self.store._maybe_hang(timeout)
        return await self.store.replace(path, body)


class HangCandidate(Candidate):
    def __init__(self, store: HangingLeases, clock: FakeClock, identity: str) -> None:
        self.events = []
        self.working = asyncio.Event()
        self.work_cancelled = False
        self.elector = LeaderElector(
            client=HangingBound(store, identity), namespace="ops", name="keb", identity=identity,
            on_started_leading=self._work, on_stopped_leading=lambda: self.events.append("stopped"),
            lease_duration=15, renew_deadline=10, retry_period=2, clock=clock, rng=random.Random(1),
        )
        self.task = asyncio.create_task(self.elector.run(), name=f"elector-{identity}")

    async def _work(self) -> None:
        self.events.append("started")
        self.working.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.work_cancelled = True
            raise


async def test_hung_renewals_end_leadership_at_the_renew_deadline() -> None:
    """A renewal that never answers must not keep the leader leading: the round is cut at the
    renew deadline (counted from the last renewal that succeeded), leadership ends at that instant,
    the work is cancelled, and the release that follows is bounded in time as well."""
    store, clock = HangingLeases(), FakeClock()
    a = HangCandidate(store, clock, "a")
    await settle()
    assert a.elector.is_leader()
    await clock.advance(2)  # one successful renewal, sent at t0 + 2
    await settle()
    renewed_at = clock.now()
    token = a.elector.fence_token()
    assert token is not None
    assert token.holder == "a"
    assert token.transitions == 0
    store.hung.add("a")
    await clock.advance(10 - 0.01)
    await settle()
    assert a.elector.is_leader()
    await clock.advance(0.01)
    assert clock.now() == renewed_at + 10
    assert not a.elector.is_leader()  # at once, before any task ran
    assert a.elector.fence_token() is None
    await settle()
    assert a.work_cancelled
    # The release hangs too; it gives up after its own bound (the renew deadline).
    await clock.advance(10)
    await settle()
    assert a.task.done()
    assert a.events == ["started", "stopped"]
    # Every request was sent with the time left of its round as its timeout.
    assert all(t is not None and 0 < t <= 10 for t in store.timeouts)


async def test_standby_takes_over_only_after_a_hung_leader_has_stepped_down() -> None:
    store, clock = HangingLeases(), FakeClock()
    a = HangCandidate(store, clock, "a")
    await settle()
    b = HangCandidate(store, clock, "b")
    await settle()
    store.hung.add("a")
    a_lost_at: float | None = None
    b_led_at: float | None = None
    for _ in range(200):
        await clock.advance(0.25)
        await settle()
        assert not (a.elector.is_leader() and b.elector.is_leader())
        if a_lost_at is None and not a.elector.is_leader():
            a_lost_at = clock.now()
        if b_led_at is None and b.elector.is_leader():
            b_led_at = clock.now()
    assert a_lost_at is not None
    assert b_led_at is not None
    assert b_led_at - a_lost_at >= 15 - 10 - 0.25  # lease_duration - renew_deadline of margin
    assert store.spec()["holderIdentity"] == "b"
    assert b.elector.fence_token() is not None
    assert b.elector.fence_token().transitions == 1  # type: ignore[union-attr]
    await b.stop()
    a.task.cancel()


async def test_expiry_ignores_the_holders_timestamps() -> None:
    """A holder whose clock is far behind (renewTime in the past) is not judged expired: expiry is
    measured from when this candidate saw the record change, on its own clock."""
    store, clock = FakeLeases(), FakeClock()
    store.objects[PATH] = {"metadata": {"name": "keb", "namespace": "ops", "resourceVersion": "1"},
                           "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15,
                                    "acquireTime": "2000-01-01T00:00:00.000000Z",
                                    "renewTime": "2000-01-01T00:00:00.000000Z", "leaseTransitions": 4}}
    store.rv = 1
    b = Candidate(store, clock, "b")
    await settle()
    for _ in range(7):
        await clock.advance(2)
        await settle()
        assert not b.elector.is_leader()
    for _ in range(3):
        await clock.advance(2)
        await settle()
    assert b.elector.is_leader()
    assert store.spec()["leaseTransitions"] == 5
    await b.stop()


async def test_leader_that_sees_another_holder_steps_down_at_once() -> None:
    store, clock = FakeLeases(), FakeClock()
    a = Candidate(store, clock, "a")
    await settle()
    assert a.elector.is_leader()
    # Someone else holds the lease now (an operator's edit, or a takeover a was not told of).
    store.rv += 1
    store.objects[PATH]["spec"]["holderIdentity"] = "z"
    store.objects[PATH]["metadata"]["resourceVersion"] = str(store.rv)
    await clock.advance(2)
    await settle()
    assert not a.elector.is_leader()  # not 10 s later, at the renew deadline
    assert a.events[-1] == "stopped"
    await a.task
