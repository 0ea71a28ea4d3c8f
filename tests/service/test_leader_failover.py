"""Leader election over real HTTP against the simulator's Lease API: failover and release."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time

from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import LeaderElector
from bridge.sim import Simulator

LEASE = "/apis/coordination.k8s.io/v1/namespaces/default/leases/keb"
RETRY_PERIOD = 0.3


def wall(micro_time: str) -> float:
    """A Lease's MicroTime as seconds since the epoch."""
    return dt.datetime.strptime(micro_time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


class Replica:
    def __init__(self, url: str, identity: str, lease_duration: float = 2.0,
                 renew_deadline: float = 1.5) -> None:
        self.client = ApiClient(server=url)
        self.identity = identity
        self.leading_since: float | None = None
        self.leading_since_wall: float | None = None
        self.stopped = asyncio.Event()
        self.elector = LeaderElector(
            client=self.client, namespace="default", name="keb", identity=identity,
            on_started_leading=self._work, on_stopped_leading=self.stopped.set,
            lease_duration=lease_duration, renew_deadline=renew_deadline, retry_period=RETRY_PERIOD,
        )
        self.task = asyncio.create_task(self.elector.run(), name=f"replica-{identity}")

    async def _work(self) -> None:
        self.leading_since = time.monotonic()
        self.leading_since_wall = time.time()
        await asyncio.Event().wait()

    async def crash(self) -> None:
        """Dies without releasing the lease (like SIGKILL)."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.client.close()

    async def stop(self) -> None:
        self.elector.stop()
        await self.task
        await self.client.close()


async def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_standby_takes_over_within_lease_duration_after_leader_dies() -> None:
    # A lease long enough that the margin below dwarfs a loaded machine's scheduling delays.
    lease_s = 8.0
    async with Simulator() as sim:
        a = Replica(sim.url, "a", lease_duration=lease_s, renew_deadline=6.0)
        await wait_for(a.elector.is_leader)
        b = Replica(sim.url, "b", lease_duration=lease_s, renew_deadline=6.0)
        await asyncio.sleep(0.5)
        assert not b.elector.is_leader()
        assert b.elector.leader == "a"

        a_lease = sim.store.get("leases.coordination.k8s.io", "keb", namespace="default")
        assert a_lease["spec"]["holderIdentity"] == "a"

        a.elector._release_on_cancel = False
        crashed_at = time.monotonic()
        await a.crash()
        await asyncio.sleep(0.2)  # (a renewal a's cancelled request still made has landed)
        a_renewed = wall(sim.store.get("leases.coordination.k8s.io", "keb",
                                       namespace="default")["spec"]["renewTime"])
        await wait_for(b.elector.is_leader, timeout=3 * lease_s)
        assert b.leading_since is not None
        assert b.leading_since_wall is not None
        # b waits out the lease: it cannot lead before a lease duration passed since a's last
        # renewal (b saw that renewal after it was written; this holds however slow the machine).
        assert b.leading_since_wall - a_renewed >= lease_s, b.leading_since_wall - a_renewed
        # ... but not much longer: the lease (from b's last sight of a renewal, at most one
        # jittered retry period of each replica before the crash) plus a retry period, and half
        # a lease for scheduling delays: waiting out a second lease, or never, fails this.
        took = b.leading_since - crashed_at
        assert took < lease_s * 1.5 + RETRY_PERIOD * 2.2, took
        lease = sim.store.get("leases.coordination.k8s.io", "keb", namespace="default")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        await b.stop()
        assert b.stopped.is_set()


async def test_graceful_stop_releases_the_lease_for_an_immediate_takeover() -> None:
    async with Simulator() as sim:
        a = Replica(sim.url, "a")
        await wait_for(a.elector.is_leader)
        b = Replica(sim.url, "b")
        await asyncio.sleep(0.3)
        stopped_at = time.monotonic()
        await a.stop()
        released = sim.store.get("leases.coordination.k8s.io", "keb", namespace="default")["spec"]
        assert released["holderIdentity"] == ""
        assert released["leaseDurationSeconds"] == 1
        await wait_for(b.elector.is_leader, timeout=3.0)
        assert b.leading_since is not None
        assert b.leading_since - stopped_at < 1.5  # well under the 2 s lease
        await b.stop()
