"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Two or more replicas run active/standby: only the holder of the Lease runs the bridge; the others
watch the Lease and take over once it expires, resuming from the shared checkpoint.

The rules (client-go ``tools/leaderelection``):

* expiry is judged from the *local* time at which this candidate last saw the record change, never
  from the holder's ``renewTime`` (clocks across nodes are not trusted; only their rates are);
* every acquire and renew attempt is bounded in time, the API client's REST retries included (each
  request gets the time left of its round as its timeout, and the round itself is cut by a timer on
  the injected clock, so a request that hangs cannot hold it);
* the leader renews every ``retry_period``; failing to renew within ``renew_deadline`` ends its
  leadership at that instant: :meth:`LeaderElector.is_leader` turns false and
  :meth:`LeaderElector.fence_token` None before any other task runs, then the work is cancelled;
* on release the holder becomes "" and ``leaseDurationSeconds`` 1, so a standby takes over at once;
  the release is bounded by ``release_timeout`` (the renew deadline unless given);
* ``leaseTransitions`` counts changes of holder;
* ``on_stopped_leading`` is always called when :meth:`LeaderElector.run` ends, even if leadership was
  never acquired.

Where the bridge is stricter than client-go: client-go starts each renew round's ``renew_deadline``
when the round starts, ``retry_period`` after the last success, so a leader whose renewals hang may
lead up to ``retry_period + renew_deadline`` after it was last renewed. Here the deadline runs from
the moment the last successful renewal was *sent*; a standby cannot have seen that renewal earlier,
so it cannot expire the lease before ``lease_duration`` after that moment, and the deposed leader
has stopped ``lease_duration - renew_deadline`` before (given clocks that run at the same rate).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.clock import Clock, RealClock
from bridge.errors import ApiError, ConflictError, NotFoundError

__all__ = ["FenceToken", "LeaderElectionRecord", "LeaderElector", "LeaseClient"]

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2


@dataclass(frozen=True, slots=True, order=True)
class FenceToken:
    """Who writes on behalf of the leadership, and in which term.

    ``transitions`` is the Lease's ``leaseTransitions`` when ``holder`` acquired it: every change of
    holder increases it, so a token with a higher count belongs to a later leader. Stores keep the
    token of the last writer and refuse a write whose token is older (see
    :mod:`bridge.storage.checkpoint`)."""

    transitions: int
    holder: str

    def supersedes(self, other: FenceToken | None) -> bool:
        """True if a writer holding this token may overwrite what ``other`` wrote."""
        return other is None or self == other or self.transitions > other.transitions


class LeaseClient(Protocol):
    """The slice of :class:`bridge.kube.apiclient.ApiClient` leader election needs. ``timeout``
    bounds the whole call, retries included."""

    async def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]: ...

    async def create(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]: ...

    async def replace(self, path: str, body: Any, *, timeout: float | None = None) -> dict[str, Any]: ...


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
        release_timeout: float | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``on_started_leading`` runs as a task while this candidate leads; it is cancelled when
        leadership ends (lost, or :meth:`stop`). When it returns by itself, leadership is given up
        (the lease released). ``release_timeout`` bounds the release (default: ``renew_deadline``)."""
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
        self.release_timeout = renew_deadline if release_timeout is None else release_timeout
        self._clock = clock or RealClock()
        self._rng = rng or random.Random()
        self._observed: LeaderElectionRecord | None = None
        self._observed_raw: dict[str, Any] | None = None
        self._observed_time = 0.0
        self._lease: dict[str, Any] | None = None
        """The Lease as this candidate last wrote it (resourceVersion included): the fast path."""
        self._reported_leader = ""
        self._stop = asyncio.Event()
        self._leading = False
        self._renew_by = 0.0
        """Leadership ends at this instant (clock time) unless a renewal succeeds before."""
        self._transitions = 0
        self.lost = False
        """True once leadership ended without being given up: no renewal succeeded in time, or the
        Lease was read held by another candidate."""

    # --- public -----------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this candidate leads. Turns false the instant the renew deadline passes, even
        before the renewing task has run."""
        return self._leading and self._clock.now() < self._renew_by

    def fence_token(self) -> FenceToken | None:
        """The token writes on behalf of this leadership carry; None when not leading."""
        if not self.is_leader():
            return None
        return FenceToken(transitions=self._transitions, holder=self.identity)

    @property
    def leader(self) -> str:
        """The holder this candidate last observed ("" if none)."""
        return self._observed.holder_identity if self._observed else ""

    def stop(self) -> None:
        """Ends :meth:`run`: campaigning stops; a leader's work is cancelled and the lease released."""
        self._stop.set()

    async def run(self) -> None:
        """Campaigns until leader, runs ``on_started_leading`` while renewing, and returns when
        leadership is lost, the work returns, or :meth:`stop` is called."""
        tasks: list[asyncio.Task[None]] = []
        try:
            if not await self._acquire():
                return
            self._leading = True
            log.info("became leader", extra={"lease": self._name, "identity": self.identity,
                                              "lease_transitions": self._transitions})
            work = asyncio.create_task(self._on_started(), name=f"leader-work-{self._name}")
            renew = asyncio.create_task(self._renew_loop(), name=f"leader-renew-{self._name}")
            stop = asyncio.create_task(self._wait_stop(), name=f"leader-stop-{self._name}")
            tasks = [work, renew, stop]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if renew in done:
                log.warning("lost leadership: could not renew the lease within the renew deadline",
                            extra={"lease": self._name, "identity": self.identity,
                                   "renew_deadline": self.renew_deadline})
            if work in done and not work.cancelled() and work.exception() is not None:
                log.error("leader work failed", exc_info=work.exception())
        finally:
            self._leading = False
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if tasks and self._release_on_cancel:
                await self._release()
            if self._on_stopped is not None:
                self._on_stopped()

    # --- internals --------------------------------------------------------------------------------

    async def _wait_stop(self) -> None:
        await self._stop.wait()

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

    async def _bounded(self, attempt: Callable[[float], Coroutine[Any, Any, bool]], deadline: float) -> bool:
        """Runs ``attempt(deadline)``; False (and the attempt cancelled) if it has not finished when
        ``deadline`` comes on the clock."""
        left = deadline - self._clock.now()
        if left <= 0:
            return False
        task = asyncio.create_task(attempt(deadline), name=f"leader-attempt-{self._name}")
        timer = asyncio.create_task(self._clock.sleep(left), name=f"leader-deadline-{self._name}")
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, timer, return_exceptions=True)
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.warning("lease attempt failed", exc_info=task.exception())
            return False
        return task.result()

    async def _acquire(self) -> bool:
        log.info("attempting to acquire the lease", extra={"lease": self._name, "identity": self.identity})
        while True:
            started = self._clock.now()
            if await self._bounded(self._try_acquire_or_renew, started + self.renew_deadline):
                self._renew_by = started + self.renew_deadline
                return True
            if self._stop.is_set():
                return False
            delay = self.retry_period * (1 + self._rng.random() * JITTER_FACTOR)
            if await self._sleep_or_stop(delay):
                return False

    async def _renew_loop(self) -> None:
        """Renews every retry period; returns (and ends leadership) when no renewal succeeded by the
        renew deadline, counted from the send time of the last successful one."""
        while True:
            await self._clock.sleep(min(self.retry_period, max(0.0, self._renew_by - self._clock.now())))
            while True:
                started = self._clock.now()
                if started >= self._renew_by:
                    self._leading = False
                    self.lost = True
                    return
                if await self._bounded(self._try_acquire_or_renew, self._renew_by):
                    self._renew_by = started + self.renew_deadline
                    break
                if self._clock.now() >= self._renew_by:
                    self._leading = False
                    self.lost = True
                    return
                await self._clock.sleep(min(self.retry_period, self._renew_by - self._clock.now()))

    def _observe(self, raw: dict[str, Any], record: LeaderElectionRecord) -> None:
        if self._observed_raw != raw.get("spec"):
            self._observed_raw = raw.get("spec")
            self._observed = record
            self._observed_time = self._clock.now()
        if record.holder_identity != self._reported_leader:
            self._reported_leader = record.holder_identity
            log.info("observed a new leader", extra={"lease": self._name, "leader": record.holder_identity,
                                                      "identity": self.identity})
            if self._on_new_leader is not None and record.holder_identity:
                self._on_new_leader(record.holder_identity)

    def _left(self, deadline: float) -> float:
        return max(0.001, deadline - self._clock.now())

    def _lease_valid(self) -> bool:
        observed = self._observed
        if observed is None:
            return False
        return self._observed_time + observed.lease_duration_seconds > self._clock.now()

    async def _try_acquire_or_renew(self, deadline: float) -> bool:
        now_wall = _micro_time(self._clock.wall())
        duration = max(1, round(self.lease_duration))
        # 1. fast path: the leader updates the lease it last wrote, without reading it first.
        if await self._renew_optimistically(deadline, now_wall=now_wall, duration=duration):
            return True
        # 2. read (or create) the record
        desired = LeaderElectionRecord(holder_identity=self.identity, lease_duration_seconds=duration,
                                       acquire_time=now_wall, renew_time=now_wall, leader_transitions=0)
        try:
            lease = await self._client.get(self._path, timeout=self._left(deadline))
        except NotFoundError:
            return await self._create(desired, deadline)
        except ApiError as e:
            log.warning("could not read the lease", extra={"lease": self._name, "error": str(e)})
            return False

        # 3. check the holder, and expiry as observed locally
        current = LeaderElectionRecord.from_lease(lease)
        self._observe(lease, current)
        held_by_other = current.holder_identity not in ("", self.identity)
        if held_by_other and self._leading:
            # Someone else holds it: this leadership is over now, not at the renew deadline.
            self._renew_by = min(self._renew_by, self._clock.now())
            log.warning("the lease is held by another candidate; stepping down",
                        extra={"lease": self._name, "holder": current.holder_identity,
                               "identity": self.identity})
            return False
        if held_by_other and self._lease_valid():
            return False
        # 4. take it over, or renew it
        if current.holder_identity == self.identity:
            desired = LeaderElectionRecord(
                holder_identity=self.identity, lease_duration_seconds=duration,
                acquire_time=current.acquire_time or now_wall, renew_time=now_wall,
                leader_transitions=current.leader_transitions)
        else:
            desired = LeaderElectionRecord(
                holder_identity=self.identity, lease_duration_seconds=duration,
                acquire_time=now_wall, renew_time=now_wall,
                leader_transitions=current.leader_transitions + 1)
        try:
            result = await self._client.replace(self._path, {**lease, "spec": desired.to_spec()},
                                                timeout=self._left(deadline))
        except ApiError as e:
            # A conflict means someone else wrote first; the next round re-reads.
            log.info("could not update the lease", extra={"lease": self._name, "error": str(e)})
            return False
        self._wrote(result, desired)
        return True

    async def _renew_optimistically(self, deadline: float, *, now_wall: str, duration: int) -> bool:
        """While leading, with the lease last written still valid: renewed without a read (True),
        else nothing done or the renewal failed (False: the lease is read next)."""
        observed = self._observed
        if not (self._leading and self._lease is not None and observed is not None
                and observed.holder_identity == self.identity and self._lease_valid()):
            return False
        renewed = LeaderElectionRecord(
            holder_identity=self.identity, lease_duration_seconds=duration,
            acquire_time=observed.acquire_time or now_wall, renew_time=now_wall,
            leader_transitions=observed.leader_transitions)
        try:
            result = await self._client.replace(self._path, {**self._lease, "spec": renewed.to_spec()},
                                                timeout=self._left(deadline))
        except ApiError as e:
            log.info("optimistic lease renewal failed; reading the lease",
                     extra={"lease": self._name, "error": str(e)})
            return False
        self._wrote(result, renewed)
        return True

    async def _create(self, desired: LeaderElectionRecord, deadline: float) -> bool:
        """Creates the lease, held by this candidate; False if another one created it first."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": desired.to_spec(),
        }
        try:
            created = await self._client.create(self._create_path, body, timeout=self._left(deadline))
        except (ConflictError, ApiError) as e:
            log.info("could not create the lease", extra={"lease": self._name, "error": str(e)})
            return False
        self._wrote(created, desired)
        return True

    def _wrote(self, result: dict[str, Any], record: LeaderElectionRecord) -> None:
        self._lease = result
        self._transitions = record.leader_transitions
        self._observe(result, record)

    async def _release(self) -> None:
        """Gives the lease up (holder "", duration 1 s) if this candidate still holds it, within
        ``release_timeout``; a failure only means the standby waits for the lease to expire."""
        start = self._clock.now()
        if not await self._bounded(self._try_release, start + self.release_timeout):
            log.warning("could not release the lease in time; the standby takes over when it expires",
                        extra={"lease": self._name, "identity": self.identity,
                               "release_timeout": self.release_timeout})

    async def _try_release(self, deadline: float) -> bool:
        try:
            lease = await self._client.get(self._path, timeout=self._left(deadline))
            current = LeaderElectionRecord.from_lease(lease)
            if current.holder_identity != self.identity:
                return True
            now_wall = _micro_time(self._clock.wall())
            released = LeaderElectionRecord(
                holder_identity="",
                lease_duration_seconds=1,
                acquire_time=now_wall,
                renew_time=now_wall,
                leader_transitions=current.leader_transitions,
            )
            result = await self._client.replace(self._path, {**lease, "spec": released.to_spec()},
                                                timeout=self._left(deadline))
        except ApiError as e:
            log.warning("could not release the lease", extra={"lease": self._name, "error": str(e)})
            return False
        self._lease = None
        self._observe(result, released)
        log.info("released the lease", extra={"lease": self._name, "identity": self.identity})
        return True
