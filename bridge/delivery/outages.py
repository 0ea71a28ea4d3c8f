"""Outage reporting: a sink failing, still failing, recovered, caught up — each said once, in the log.

Every ``outage_check_interval`` seconds each sink's health is checked: a WARNING when it starts
failing (with its last error and what waits for it: the other sinks are not held back), a summary
every ``outage_summary_interval`` seconds while it stays down (backlog, spilled bytes, age of the
oldest unacknowledged change), an INFO when it recovers (what it has to catch up) and one when it
has caught up (how many events in how long).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.clock import Clock
from bridge.delivery.chain import DeliveryChain
from bridge.delivery.inspection import PipelineInspection

__all__ = ["OutageReporter"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Outage:
    since: float | None = None
    """When the sink started failing (None while it is healthy)."""
    last_summary: float = 0.0
    catching_up: float | None = None
    """When it recovered, until its backlog is empty."""
    delivered_at: int = 0


class OutageReporter:
    """Reports the outages of a pipeline's sinks (module docs)."""

    def __init__(self, *, sinks: Sequence[DeliveryChain], view: PipelineInspection,
                 summary_interval: float) -> None:
        self._sinks = sinks
        self._view = view
        self._outage_summary = summary_interval
        self._outages: dict[str, _Outage] = {}

    async def run(self, clock: Clock, interval: float) -> None:
        """Checks every ``interval`` seconds, until cancelled."""
        while True:
            await clock.sleep(interval)
            self.check(clock.now())

    def check(self, now: float) -> None:
        """Logs the outages of the sinks (module docs); called periodically."""
        for sink in self._sinks:
            name = sink.name
            st = self._outages.setdefault(name, _Outage())
            if not sink.healthy():
                error = sink.last_error or "unknown error"
                if st.since is None:
                    st.since = st.last_summary = now
                    st.catching_up = None
                    backlog = self._view.sink_backlog(name)
                    log.warning("sink %s is failing: %s; its changes wait for it (%d waiting), the "
                                "other sinks are not held back", name, error, backlog.depth,
                                extra={"sink": name, "error": error})
                elif now - st.last_summary >= self._outage_summary:
                    st.last_summary = now
                    backlog = self._view.sink_backlog(name)
                    lag = self._view.sink_lag(name)
                    log.warning("sink %s still failing after %.0fs: %d changes waiting, %d bytes "
                                "spilled, oldest unacknowledged %.0fs old; last error: %s", name,
                                now - st.since, backlog.depth, backlog.spill_bytes, lag, error,
                                extra={"sink": name, "backlog": backlog.depth,
                                       "spill_bytes": backlog.spill_bytes, "lag_seconds": lag})
                continue
            if st.since is not None:
                down = now - st.since
                st.since = None
                st.catching_up = now
                st.delivered_at = self._view.delivered(name)
                backlog = self._view.sink_backlog(name)
                log.info("sink %s recovered after %.1fs; %d changes to catch up", name, down,
                         backlog.depth, extra={"sink": name, "down_seconds": down,
                                               "backlog": backlog.depth})
            if st.catching_up is not None and self._view.sink_backlog(name).depth == 0 \
                    and self._view.sink_lag(name) == 0.0:
                caught = self._view.delivered(name) - st.delivered_at
                log.info("sink %s caught up: %d events in %.1fs", name, caught, now - st.catching_up,
                         extra={"sink": name, "caught_up": caught})
                st.catching_up = None
