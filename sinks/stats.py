"""The counters of one sink, which the bridge exports as its metrics.

Every accepted event ends in exactly one of ``delivered``, ``dead_lettered``, ``failed`` (and
``filtered`` counts those never accepted); ``in_flight`` is the gauge of those accepted and not yet
settled (the in-flight window's count, :mod:`sinks.window`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SinkStats"]


@dataclass(slots=True)
class SinkStats:
    """Counters of one sink since it was built."""

    accepted: int = 0
    delivered: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    failed: int = 0
    """Permanent failures with no dead-letter destination (acked ``DROPPED``)."""
    retries: int = 0
    in_flight: int = 0
    filter_errors: int = 0
    """Events the CEL filter failed on (then kept or dropped as ``filter_errors`` says)."""

    def as_dict(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "delivered": self.delivered,
            "filtered": self.filtered,
            "dead_lettered": self.dead_lettered,
            "failed": self.failed,
            "retries": self.retries,
            "in_flight": self.in_flight,
            "filter_errors": self.filter_errors,
        }
