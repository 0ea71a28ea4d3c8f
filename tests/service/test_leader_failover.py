"""Leader election over real HTTP against the simulator's Lease API: failover and release."""

from __future__ import annotations

import asyncio
import contextlib
import time

from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import LeaderElector
from bridge.sim import Simulator

LEASE = "/apis/coordination.k8s.io/v1/namespaces/default/leases/keb"


class Replica:
    def __init__(self, url: str, identity: str) -> None:
        self.client = ApiClient(server=url)
        self.identity = identity
        self.leading_since: float | None = None
        self.stopped = asyncio.Event()
        self.elector = LeaderElector(
            client=self.client, namespace="default", name="keb", identity=identity,
            on_started_leading=self._work, on_stopped_leading=self.stopped.set,
            lease_duration=2.0, renew_deadline=1.5, retry_period=0.3,
        )
        self.task = asyncio.create_task(self.elector.run(), name=f"replica-{identity}")

    async def _work(self) -> None:
        self.leading_since = time.monotonic()
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
    async with Simulator() as sim:
        a = Replica(sim.url, "a")
        await wait_for(a.elector.is_leader)
        b = Replica(sim.url, "b")
        await asyncio.sleep(0.5)
        assert not b.elector.is_leader()
        assert b.elector.leader == "a"

        a_lease = sim.store.get("leases.coordination.k8s.io", "keb", namespace="default")
        assert a_lease["spec"]["holderIdentity"] == "a"

        a.elector._release_on_cancel = False
        crashed_at = time.monotonic()
        await a.crash()
        await wait_for(b.elector.is_leader, timeout=6.0)
        assert b.leading_since is not None
        took = b.leading_since - crashed_at
        # b must wait out the lease (2 s from when it last saw a renewal) but not much longer.
        assert 1.0 < took < 2.0 + 2 * 0.3 * 2.2 + 1.0
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
