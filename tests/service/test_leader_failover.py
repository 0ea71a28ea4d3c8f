"""Leader election over real HTTP against the simulator's Lease API: failover and release.

The replicas' clock is a :class:`~bridge.clock.FakeClock` shared by both, moved by the test only while
no lease request is in flight: every retry period, renew deadline and lease duration is then exact,
so the bounds below are the elector's own arithmetic, which no scheduling delay of a loaded machine
can stretch. (A lease request's own time on the wire counts for nothing on that clock; the real
timeouts it is given are the generous renew deadline's.)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Callable
from typing import Any

from bridge.clock import FakeClock
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import JITTER_FACTOR, LeaderElector
from bridge.sim import Simulator

RETRY_PERIOD = 0.3
LEASE_S, RENEW_S = 8.0, 6.0
ONE_RETRY = RETRY_PERIOD * (1 + JITTER_FACTOR)
"""The longest a candidate waits between two attempts."""


def wall(micro_time: str) -> float:
    """A Lease's MicroTime as seconds since the epoch."""
    return dt.datetime.strptime(micro_time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


class TrackedClient:
    """The elector's lease client, counting the requests in flight (the clock stands still while
    any is)."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.in_flight = 0

    async def _call(self, call: Any, *args: Any, timeout: float | None) -> dict[str, Any]:
        self.in_flight += 1
        try:
            return await call(*args, timeout=timeout)  # type: ignore[no-any-return]
        finally:
            self.in_flight -= 1

    async def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]:
        return await self._call(self.client.get, path, timeout=timeout)

    async def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        return await self._call(self.client.create, path, body, timeout=timeout)

    async def replace(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]:
        return await self._call(self.client.replace, path, body, timeout=timeout)


class Replica:
    def __init__(self, url: str, identity: str, clock: FakeClock) -> None:
        self.client = TrackedClient(ApiClient(server=url))
        self.identity = identity
        self.clock = clock
        self.leading_since: float | None = None
        self.stopped = asyncio.Event()
        self.elector = LeaderElector(
            client=self.client, namespace="default", name="keb", identity=identity,
            on_started_leading=self._work, on_stopped_leading=self.stopped.set,
            lease_duration=LEASE_S, renew_deadline=RENEW_S, retry_period=RETRY_PERIOD, clock=clock,
        )
        self.task = asyncio.create_task(self.elector.run(), name=f"replica-{identity}")

    async def _work(self) -> None:
        self.leading_since = self.clock.now()
        await asyncio.Event().wait()

    async def crash(self) -> None:
        """Dies without releasing the lease (like SIGKILL)."""
        self.elector._release_on_cancel = False
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.client.client.close()

    async def stop(self) -> None:
        self.elector.stop()
        await self.task
        await self.client.client.close()


async def settle(replicas: list[Replica]) -> None:
    """Returns once no replica has had a lease request in flight for a hundred turns of the loop:
    each has then handled its last answer and is asleep on the clock (or has ended)."""
    idle = 0
    while idle < 100:
        if any(r.client.in_flight for r in replicas):
            idle = 0
            await asyncio.sleep(0.001)  # a request on the wire: real time for it to be answered
        else:
            idle += 1
            await asyncio.sleep(0)


async def run_until(clock: FakeClock, replicas: list[Replica], cond: Callable[[], bool],
                    most: float) -> float:
    """Moves the clock from sleeper to sleeper until ``cond`` holds; returns the clock time it took,
    failing if that exceeds ``most`` (clock seconds)."""
    start = clock.now()
    while True:
        await settle(replicas)
        if cond():
            return clock.now() - start
        assert clock.now() - start <= most, f"not reached within {most} s on the clock"
        assert await clock.step(), "nobody sleeps on the clock"


async def test_standby_takes_over_within_lease_duration_after_leader_dies() -> None:
    clock = FakeClock(wall_start=1_800_000_000.0)
    async with Simulator() as sim:
        a = Replica(sim.url, "a", clock)
        await run_until(clock, [a], a.elector.is_leader, most=0)
        b = Replica(sim.url, "b", clock)
        both = [a, b]
        await run_until(clock, both, lambda: b.elector.leader == "a", most=0)
        # a renews for a while, b watches
        watched = clock.now() + 2 * LEASE_S
        await run_until(clock, both, lambda: clock.now() >= watched, most=3 * LEASE_S)
        assert a.elector.is_leader()
        assert not b.elector.is_leader()
        assert b.elector.leader == "a"

        await a.crash()
        a_renewed = wall(sim.store.get("leases.coordination.k8s.io", "keb",
                                       namespace="default")["spec"]["renewTime"])
        await run_until(clock, [b], b.elector.is_leader, most=3 * LEASE_S)
        assert b.leading_since is not None
        took = b.leading_since + (clock.wall() - clock.now()) - a_renewed
        # b waits out the lease: it cannot lead before a lease duration passed since a's last renewal
        assert took >= LEASE_S, took
        # ... and no longer than needed: b saw that renewal at its next attempt (one jittered retry
        # period at most), and takes over at its first attempt once a lease duration passed since.
        assert took <= LEASE_S + 2 * ONE_RETRY, took
        lease = sim.store.get("leases.coordination.k8s.io", "keb", namespace="default")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        assert abs(wall(lease["spec"]["acquireTime"]) - a_renewed - took) < 1e-3
        await b.stop()
        assert b.stopped.is_set()


async def test_graceful_stop_releases_the_lease_for_an_immediate_takeover() -> None:
    clock = FakeClock(wall_start=1_800_000_000.0)
    async with Simulator() as sim:
        a = Replica(sim.url, "a", clock)
        await run_until(clock, [a], a.elector.is_leader, most=0)
        b = Replica(sim.url, "b", clock)
        both = [a, b]
        await run_until(clock, both, lambda: b.elector.leader == "a", most=0)
        assert not b.elector.is_leader()
        stopped_at = clock.now()
        await a.stop()
        released = sim.store.get("leases.coordination.k8s.io", "keb", namespace="default")["spec"]
        assert released["holderIdentity"] == ""
        assert released["leaseDurationSeconds"] == 1
        took = await run_until(clock, [b], b.elector.is_leader, most=LEASE_S)
        assert b.leading_since is not None
        # b takes over at its next attempt, one jittered retry period at most: it waits out neither
        # a's lease nor the released record's one second
        assert b.leading_since - stopped_at == took
        assert 0 < took <= ONE_RETRY, took
        await b.stop()
