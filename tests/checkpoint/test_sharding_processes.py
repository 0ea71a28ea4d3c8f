"""The issue's Done-when, as a test: three ``kube-event-bridge run`` shard processes against the
simulator under churn with a real Kafka broker, then resharded 3 → 4 → 2 under churn (all stopped,
the new total started). The union of what they deliver equals every change made, no uid is delivered
by two shards of one total, ``kube-event-bridge verify`` is green, the earlier totals' checkpoints
are removed, and re-sent events stay within the in-flight bound (docs/sharding.md).
Longer and SIGKILL variants: scripts/sharding-soak (tests/checkpoint/sharding_harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.brokers import TansuBroker
from tests.checkpoint.sharding_harness import run


@pytest.mark.slow
@pytest.mark.timeout(240)  # ~40 s on 2 idle cores; the headroom is for loaded CI machines
async def test_reshard_3_4_2_under_churn(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    result = await run(work=tmp_path, kafka=kafka_broker, totals=[3, 4, 2], phase=4.0, rate=60.0,
                       names=60)
    print("\n" + result.summary())
    assert not result.problems, result.summary()
    assert result.changes > 400
    # A graceful stop drains and writes a final checkpoint: a reshard re-sends nothing.
    assert result.resent == 0
