"""Issue #13: a sink outage is visible: WARNING when it starts failing (with the error), a periodic
summary while it stays down, INFO when it recovers and when it caught up; per-sink metrics for
backlog, spill bytes and lag; /readyz detail names the sink."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bridge.clock import RealClock
from bridge.delivery.pipeline import BridgePipeline
from bridge.testing import Reply, WebhookReceiver
from bridge.testing.fake_source import FakeControllerSource
from sinks.webhook import WebhookSink
from tests.checkpoint.helpers import WATCHED, RecordingSink, cm, fake_builder, until


async def test_a_webhook_outage_is_logged_measured_and_named(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    receiver = await WebhookReceiver(reply=Reply(503, body="down for maintenance")).start()
    hook = WebhookSink.from_options("hook", {"url": receiver.url,
                                             "retry": {"initial": 0.02, "max": 0.05},
                                             "buffer": {"capacity": 4}, "max_in_flight": 2})
    other = RecordingSink("other")
    other.overflow_policy = "spill"
    source = FakeControllerSource()
    clock = RealClock()
    p = BridgePipeline(resources=[WATCHED], sinks=[hook, other], checkpoint_store=None,
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill", outage_check_interval=0.05,
                       outage_summary_interval=0.3)
    caplog.set_level(logging.INFO, logger="bridge.delivery")
    await p.start()
    try:
        for i in range(30):
            source.add(cm(f"o{i}"))
        await until(lambda: len(other.events) == 30, what="the other sink got everything")
        await until(lambda: "sink hook is failing" in caplog.text, what="the failure warning")
        warning = next(r for r in caplog.records if "sink hook is failing" in r.getMessage())
        assert warning.levelno == logging.WARNING
        assert "503" in warning.getMessage()  # the error itself
        await until(lambda: "sink hook still failing" in caplog.text, what="a periodic summary")
        summary = next(r for r in caplog.records if "still failing" in r.getMessage()).getMessage()
        for part in ("changes waiting", "bytes spilled", "oldest unacknowledged"):
            assert part in summary
        gauges = p.telemetry_snapshot().sinks["hook"]
        assert gauges.queue_depth > 0
        assert gauges.spill_bytes > 0
        assert gauges.lag_seconds > 0
        assert p.telemetry_snapshot().sinks["other"].lag_seconds == 0
        reasons = p.not_ready_reasons()
        assert any(r.startswith("sink hook unhealthy: ") and "503" in r for r in reasons), reasons
        assert not any("other" in r for r in reasons)

        receiver.reply = Reply(200)
        await until(lambda: "sink hook caught up" in caplog.text, 20, what="the catch-up info")
        recovered = next(r for r in caplog.records if "sink hook recovered after" in r.getMessage())
        assert recovered.levelno == logging.INFO
        caught = next(r for r in caplog.records if "sink hook caught up" in r.getMessage())
        assert caught.levelno == logging.INFO
        assert len(receiver.accepted) == 30
        assert p.telemetry_snapshot().sinks["hook"].spill_bytes == 0
        assert not any(r.startswith("sink hook") for r in p.not_ready_reasons())
    finally:
        receiver.reply = Reply(200)
        await p.shutdown(5)
        await receiver.close()
        await asyncio.sleep(0)
