"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Two or more replicas run active/standby: only the holder of the Lease runs the bridge; the others
watch the Lease and take over once it expires, resuming from the shared checkpoint.

The rules (client-go ``tools/leaderelection``):

* expiry is judged from the *local* time at which this candidate last saw the record change, never
  from the holder's ``renewTime`` (clocks across nodes are not trusted);
* the leader renews every ``retry_period``; failing to renew within ``renew_deadline`` ends its
  leadership (``lease_duration > renew_deadline > 1.2 * retry_period`` gives others a safe margin);
* on release the holder becomes "" and ``leaseDurationSeconds`` 1, so a standby takes over at once;
* ``leaseTransitions`` counts changes of holder;
* ``on_stopped_leading`` is always called when :meth:`LeaderElector.run` ends, even if leadership was
  never acquired.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.clock import Clock, RealClock
from bridge.errors import ApiError, ConflictError, NotFoundError

__all__ = ["LeaderElectionRecord", "LeaderElector", "LeaseClient"]

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2


class LeaseClient(Protocol):
    """The slice of :class:`bridge.apiclient.ApiClient` leader election needs."""

    async def get(self, path: str) -> dict[str, Any]: ...

    async def create(self, path: str, body: Any) -> dict[str, Any]: ...

    async def replace(self, path: str, body: Any) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class LeaderElectionRecord:
    holder_identity: str
    lease_duration_seconds: int
    acquire_time: str
    renew_time: str
    leader_transitions: int

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaderElectionRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            leader_transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.leader_transitions,
        }


def _micro_time(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        *,
        client: LeaseClient,
        namespace: str,
        name: str,
        identity: str,
        on_started_leading: Callable[[], Coroutine[Any, Any, None]],
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_cancel: bool = True,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not lease_duration > renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not renew_deadline > JITTER_FACTOR * retry_period:
            raise ValueError("renew_deadline must be greater than 1.2 * retry_period")
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        self._client = client
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._create_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._release_on_cancel = release_on_cancel
        self._clock = clock or RealClock()
        self._rng = rng or random.Random()
        self._observed: LeaderElectionRecord | None = None
        self._observed_raw: dict[str, Any] | None = None
        self._observed_time = 0.0
        self._reported_leader = ""
        self._stop = asyncio.Event()
        self._leading = False

    # --- public -----------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self._leading

    @property
    def leader(self) -> str:
        """The holder this candidate last observed ("" if none)."""
        return self._observed.holder_identity if self._observed else ""

    def stop(self) -> None:
        """Ends :meth:`run`: a leader stops its work and releases the Lease."""
        self._stop.set()

    async def run(self) -> None:
        """Campaigns until leader, runs ``on_started_leading`` while renewing, and returns when
        leadership is lost, the work returns, or :meth:`stop` is called."""
        tasks: list[asyncio.Task[None]] = []
        try:
            if not await self._acquire():
                return
            self._leading = True
            log.info("became leader", extra={"lease": self._name, "identity": self.identity})
            work = asyncio.create_task(self._on_started(), name=f"leader-work-{self._name}")
            renew = asyncio.create_task(self._renew_loop(), name=f"leader-renew-{self._name}")
            stop = asyncio.create_task(self._wait_stop(), name=f"leader-stop-{self._name}")
            tasks = [work, renew, stop]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if renew in done:
                log.warning("lost leadership: could not renew the lease within the renew deadline",
                            extra={"lease": self._name, "identity": self.identity})
            if work in done and not work.cancelled() and work.exception() is not None:
                log.error("leader work failed", exc_info=work.exception())
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            was_leading = self._leading
            self._leading = False
            if was_leading and self._release_on_cancel:
                await self._release()
            if self._on_stopped is not None:
                self._on_stopped()

    async def _wait_stop(self) -> None:
        await self._stop.wait()

    # --- internals --------------------------------------------------------------------------------

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleeps on the clock; True if stop was requested meanwhile."""
        if self._stop.is_set():
            return True
        sleeper = asyncio.create_task(self._clock.sleep(seconds), name=f"leader-sleep-{self._name}")
        stopper = asyncio.create_task(self._stop.wait(), name=f"leader-stopwait-{self._name}")
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, stopper):
                t.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
        return self._stop.is_set()

    async def _acquire(self) -> bool:
        while True:
            if await self._try_acquire_or_renew():
                return True
            delay = self.retry_period * (1 + self._rng.random() * JITTER_FACTOR)
            if await self._sleep_or_stop(delay):
                return False

    async def _renew_loop(self) -> None:
        """Returns when a renewal could not succeed within the renew deadline."""
        while True:
            deadline = self._clock.now() + self.renew_deadline
            renewed = False
            while self._clock.now() < deadline:
                if await self._try_acquire_or_renew():
                    renewed = True
                    break
                await self._clock.sleep(min(self.retry_period, max(0.0, deadline - self._clock.now())))
            if not renewed:
                return
            await self._clock.sleep(self.retry_period)

    def _observe(self, raw: dict[str, Any], record: LeaderElectionRecord) -> None:
        if self._observed_raw != raw.get("spec"):
            self._observed_raw = raw.get("spec")
            self._observed = record
            self._observed_time = self._clock.now()
        if record.holder_identity != self._reported_leader:
            self._reported_leader = record.holder_identity
            if self._on_new_leader is not None and record.holder_identity:
                self._on_new_leader(record.holder_identity)

    async def _try_acquire_or_renew(self) -> bool:
        now_wall = _micro_time(self._clock.wall())
        desired = LeaderElectionRecord(
            holder_identity=self.identity,
            lease_duration_seconds=max(1, round(self.lease_duration)),
            acquire_time=now_wall,
            renew_time=now_wall,
            leader_transitions=0,
        )
        try:
            lease = await self._client.get(self._path)
        except NotFoundError:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": desired.to_spec(),
            }
            try:
                created = await self._client.create(self._create_path, body)
            except (ConflictError, ApiError) as e:
                log.info("could not create the lease", extra={"lease": self._name, "error": str(e)})
                return False
            self._observe(created, desired)
            return True
        except ApiError as e:
            log.warning("could not read the lease", extra={"lease": self._name, "error": str(e)})
            return False

        current = LeaderElectionRecord.from_lease(lease)
        self._observe(lease, current)
        held_by_other = current.holder_identity not in ("", self.identity)
        if held_by_other and self._observed_time + current.lease_duration_seconds > self._clock.now():
            return False
        if current.holder_identity == self.identity:
            desired = LeaderElectionRecord(
                holder_identity=self.identity,
                lease_duration_seconds=desired.lease_duration_seconds,
                acquire_time=current.acquire_time or now_wall,
                renew_time=now_wall,
                leader_transitions=current.leader_transitions,
            )
        else:
            desired = LeaderElectionRecord(
                holder_identity=self.identity,
                lease_duration_seconds=desired.lease_duration_seconds,
                acquire_time=now_wall,
                renew_time=now_wall,
                leader_transitions=current.leader_transitions + 1,
            )
        updated = dict(lease)
        updated["spec"] = desired.to_spec()
        try:
            result = await self._client.replace(self._path, updated)
        except ApiError as e:
            # A conflict means someone else wrote first; the next round re-reads.
            log.info("could not update the lease", extra={"lease": self._name, "error": str(e)})
            return False
        self._observe(result, desired)
        return True

    async def _release(self) -> None:
        with contextlib.suppress(ApiError):
            lease = await self._client.get(self._path)
            current = LeaderElectionRecord.from_lease(lease)
            if current.holder_identity != self.identity:
                return
            now_wall = _micro_time(self._clock.wall())
            released = LeaderElectionRecord(
                holder_identity="",
                lease_duration_seconds=1,
                acquire_time=now_wall,
                renew_time=now_wall,
                leader_transitions=current.leader_transitions,
            )
            updated = dict(lease)
            updated["spec"] = released.to_spec()
            await self._client.replace(self._path, updated)
            log.info("released the lease", extra={"lease": self._name, "identity": self.identity})
