"""Workers' Done-when, as a test: one ``kube-event-bridge run`` with ``workers: 2`` (a supervisor and
two worker processes) against the simulator under churn with a real Kafka broker; one worker
SIGKILLed by its PID and restarted alone by the supervisor; then the bridge restarted with
``workers: 3``. The union of what the workers delivered equals every change made, in per-object
order, each uid delivered by the worker that owns it, ``kube-event-bridge verify`` green, the
2-worker checkpoints removed, re-sends within the bound of docs/sharding.md ("Workers"), and the
pod's one /metrics carrying every worker's samples and the restart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.brokers import TansuBroker
from tests.checkpoint.workers_harness import run


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_workers_2_kill_one_then_3_under_churn(tmp_path: Path, kafka_broker: TansuBroker) -> None:
    out = await run(work=tmp_path, kafka=kafka_broker, counts=[2, 3], phase=6.0, rate=60.0, names=60)
    result = out.result
    print("\n" + result.summary() + f"\n  killed pid {out.killed[0]}, restarted as {out.killed[1]}; "
          f"re-sent {result.resent} (bound {out.resend_bound})")
    assert not result.problems, result.summary()
    assert result.changes > 400
    assert out.killed[0] != out.killed[1]
    # Only the SIGKILLed worker may re-send: what it had not acknowledged or checkpointed.
    assert result.resent <= out.resend_bound
    first, last = out.metrics
    assert 'keb_worker_restarts_total{worker="1"} 1' in first
    assert 'keb_worker_restarts_total{worker="0"} 0' in first
    assert "keb_workers 3" in last
    # Every worker's own samples, labelled with the worker and its shard of the total.
    for w in range(3):
        assert re.search(rf'keb_\w+\{{worker="{w}",[^}}]*shard="{w}"', last), w
    # One HELP/TYPE per family: the text is a valid exposition, not three concatenated.
    types = [line.split()[2] for line in last.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
