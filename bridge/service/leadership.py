"""Active/standby: the campaign for the Lease, and leading while holding it.

A :class:`LeaderCampaign` runs one :class:`~bridge.kube.leaderelection.LeaderElector` on the Lease
of this replica (of its shard, with sharding; of its node, or of the unscheduled owner, by node)
and runs the service's term (:mod:`bridge.service.term`) as the elector's work while this replica
leads. Its invariants:

* SIGTERM (the stop event) of a standby, or of a candidate still acquiring, stops the campaign at
  once; a leader's term sees the stop event itself and shuts down gracefully (final checkpoint
  included), and only then is the Lease released (within ``RELEASE_TIMEOUT``).
* Leadership lost (no renewal within the renew deadline, or the Lease read held by another) cancels
  the term, which then aborts: the fence at the end of each delivery chain has already stopped
  handing changes on, and the checkpoint store refuses writes (it is fenced by the elector's lease
  token). The campaign then ends with exit code 1, so that the pod restarts as a standby.
* A configuration error found while leading (aliases found by discovery, a sink refusing its
  options) stops the service and is kept in :attr:`LeaderCampaign.config_error`, for the service
  to raise as without leader election: the elector itself only logs what its work raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bridge.clock import Clock
from bridge.errors import ConfigurationError
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import LeaderElector
from bridge.service.config import BridgeConfig
from sinks.contract import SinkConfigError

__all__ = ["RELEASE_TIMEOUT", "LeaderCampaign", "lease_name"]

log = logging.getLogger(__name__)

RELEASE_TIMEOUT = 2.0
"""At most this long (never more than the renew deadline) is kept, out of ``shutdown_deadline``, for
releasing the Lease after the final checkpoint."""


def lease_name(config: BridgeConfig, shard: tuple[int, int] | None) -> str:
    """The Lease this replica campaigns for. With sharding, each shard has its own (one leader and
    its standbys per shard); by node, each node's replica and the unscheduled owner have theirs."""
    le, sh = config.leader_election, config.sharding
    if sh.strategy == "node":
        return f"{le.name}-unscheduled" if sh.unscheduled else f"{le.name}-node-{sh.node_name}"
    return le.name if shard is None else f"{le.name}-shard-{shard[0]}"


class LeaderCampaign:
    """Campaigns for the Lease and runs ``lead(elector)`` while this replica holds it (module docs)."""

    def __init__(self, *, config: BridgeConfig, client: ApiClient, clock: Clock, stop_event: asyncio.Event,
                 lead: Callable[[LeaderElector], Awaitable[None]], shard: tuple[int, int] | None) -> None:
        """``client`` is leader election's own (:func:`~bridge.service.connections.lease_client_options`);
        ``shard`` this replica's (ordinal, total) when sharded by shard, resolved beforehand."""
        le = config.leader_election
        self._stop_event = stop_event
        self._lead = lead
        self.config_error: ConfigurationError | None = None
        """A configuration error found while leading: the service raises it once the campaign ended."""
        self.elector = LeaderElector(
            client=client, namespace=le.namespace, name=lease_name(config, shard), identity=le.identity,
            on_started_leading=lambda: self._lead_or_stop(self.elector),
            lease_duration=le.lease_duration, renew_deadline=le.renew_deadline,
            retry_period=le.retry_period, release_timeout=min(le.renew_deadline, RELEASE_TIMEOUT),
            clock=clock,
        )

    async def run(self) -> int:
        """Campaigns until the stop event (then the leader's graceful shutdown, then the release) or
        until leadership ends; returns the exit code: 1 when leadership was lost, or when the work
        ended without the stop event, else 0."""
        elector = self.elector
        elector_task = asyncio.create_task(elector.run(), name="leader-election")
        stop_task = asyncio.create_task(self._stop_event.wait(), name="service-stop")
        try:
            await asyncio.wait({elector_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if self._stop_event.is_set() and not elector.is_leader():
                elector.stop()  # a standby (or a candidate still acquiring) stops at once
            # A leader's work sees the stop event itself: drain, final checkpoint, return; the
            # elector then releases the Lease.
            await elector_task
        finally:
            stop_task.cancel()
            elector.stop()
            await asyncio.gather(elector_task, stop_task, return_exceptions=True)
        if elector.lost:
            log.error("leadership lost; exiting so that the pod restarts as a standby")
            return 1
        if not self._stop_event.is_set():
            log.error("leader work ended unexpectedly; exiting")
            return 1
        return 0

    async def _lead_or_stop(self, elector: LeaderElector) -> None:
        """``lead`` for the elector, which only logs what its work raises: a configuration error
        found while leading stops the service and is kept for it (module docs)."""
        try:
            await self._lead(elector)
        except ConfigurationError as e:
            self.config_error = e
            self._stop_event.set()
        except SinkConfigError as e:
            self.config_error = ConfigurationError(f"invalid configuration: {e}")
            self._stop_event.set()
