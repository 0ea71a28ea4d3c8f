"""BaseSink: filtering, ordering per object, in-flight window, retries, dead letters, barriers."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.clock import FakeClock
from bridge.contracts import OverflowPolicy
from sinks.base import BaseSink, OutgoingMessage
from sinks.contract import (
    DeliveryOptions,
    DeliveryOutcome,
    EventType,
    SinkConfigError,
    SinkError,
    SinkPermanentError,
    SinkTransientError,
    SnapshotInfo,
)
from sinks.options import SinkOptions, delivery_options
from tests.sinks import PODS, SECRETS, Acks, RecordingSink, event, marker, obj


def make(clock: FakeClock | None = None, **opts: Any) -> RecordingSink:
    options = SinkOptions.from_mapping("rec", {"retry": {"initial": 0.01, "max": 0.05}, **opts})
    return RecordingSink(name="rec", options=options, clock=clock, rng=lambda: 0.5)


async def test_delivers_and_acks_each_event_with_envelope() -> None:
    sink = make(destination="k8s.{namespace}.{resource}")
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a", uid="u-a")), acks.cb("a"))
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.DELIVERED)]
    (msg,) = sink.sent
    assert msg.key == b"u-a"
    assert msg.destination == "k8s.default.pods"
    assert msg.headers == {"content-type": "application/cloudevents+json"}
    ce = orjson.loads(msg.body)
    assert ce["type"] == "io.kube-event-bridge.added"
    assert ce["subject"] == "default/a"
    assert ce["data"]["metadata"]["uid"] == "u-a"
    assert sink.stats.as_dict() == {
        "accepted": 1,
        "delivered": 1,
        "filtered": 0,
        "dead_lettered": 0,
        "failed": 0,
        "retries": 0,
        "in_flight": 0,
        "filter_errors": 0,
    }
    await sink.close()


async def test_routing_and_change_filter_ack_filtered() -> None:
    sink = make(
        routing={"namespaces": ["default"], "label_selector": "app in (web)"},
        change_filter={"ignore_paths": ["metadata.resourceVersion", "status"]},
    )
    acks = Acks()
    web = obj("w", labels={"app": "web"}, rv="1", status={"phase": "Pending"})
    await sink.deliver(event(EventType.ADDED, obj("x", namespace="kube-system")), acks.cb("other-ns"))
    await sink.deliver(event(EventType.ADDED, obj("y", labels={"app": "db"})), acks.cb("other-label"))
    status_only = {
        **web,
        "metadata": {**web["metadata"], "resourceVersion": "2"},
        "status": {"phase": "Running"},
    }
    await sink.deliver(event(EventType.UPDATED, status_only, old=web), acks.cb("status-only"))
    spec_change = {**status_only, "spec": {"x": 1}}
    await sink.deliver(event(EventType.UPDATED, spec_change, old=status_only), acks.cb("spec"))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.FILTERED) == ["other-ns", "other-label", "status-only"]
    assert acks.of(DeliveryOutcome.DELIVERED) == ["spec"]
    assert sink.stats.filtered == 3
    await sink.close()


async def test_transient_failures_retry_with_backoff_and_keep_per_object_order() -> None:
    clock = FakeClock()
    sink = make(clock=clock, retry={"initial": 1.0, "max": 4.0, "factor": 2.0, "jitter": 0.0})
    sink.failures["a"] = [SinkTransientError("down"), SinkTransientError("down"), SinkTransientError("x")]
    acks = Acks()
    for rv in ("1", "2", "3"):
        await sink.deliver(
            event(EventType.UPDATED, obj("a", rv=rv), old=obj("a", rv="0", spec=rv)), acks.cb(f"a{rv}")
        )
    await sink.deliver(event(EventType.ADDED, obj("b")), acks.cb("b"))
    for _ in range(5):
        await asyncio.sleep(0)
    # b is not held back by a's retries; a1 waits for its backoff (1 s, then 2 s, then 4 s).
    assert acks.outcomes == [("b", DeliveryOutcome.DELIVERED)]
    assert clock.next_deadline() == pytest.approx(clock.now() + 1.0)
    await clock.advance(1.0)
    assert clock.next_deadline() == pytest.approx(clock.now() + 2.0)
    await clock.advance(2.0)
    assert clock.next_deadline() == pytest.approx(clock.now() + 4.0)
    await clock.advance(4.0)
    assert await sink.flush(5)
    assert [label for label, _ in acks.outcomes] == ["b", "a1", "a2", "a3"]
    assert [m.event.resource_version for m in sink.sent if m.event.name == "a"] == ["1", "2", "3"]
    assert sink.stats.retries == 3
    assert sink.healthy()
    await sink.close()


async def test_retry_after_is_honoured() -> None:
    clock = FakeClock()
    sink = make(clock=clock)
    sink.failures["a"] = [SinkTransientError("429", retry_after=7.5)]
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not sink.healthy()
    assert clock.next_deadline() == pytest.approx(clock.now() + 7.5)
    await clock.advance(7.5)
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.DELIVERED)]
    await sink.close()


async def test_permanent_failure_goes_to_dead_letter_file_with_reason(tmp_path: Path) -> None:
    dl = tmp_path / "dead" / "letters.jsonl"
    sink = make(dead_letter={"kind": "file", "target": str(dl)})
    await sink.start()
    sink.failures["bad"] = [SinkPermanentError("HTTP 400: schema rejected")]
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("bad", uid="u-bad")), acks.cb("bad"))
    await sink.deliver(event(EventType.ADDED, obj("good")), acks.cb("good"))
    assert await sink.flush(5)
    assert sorted(acks.outcomes) == [
        ("bad", DeliveryOutcome.DEAD_LETTERED),
        ("good", DeliveryOutcome.DELIVERED),
    ]
    (line,) = dl.read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["reason"] == "HTTP 400: schema rejected"
    assert record["sink"] == "rec"
    assert record["attempts"] == 1
    assert record["key"] == "u-bad"
    assert record["message"]["subject"] == "default/bad"
    assert record["message"]["data"]["metadata"]["uid"] == "u-bad"
    assert sink.stats.dead_lettered == 1
    await sink.close()


async def test_giving_up_after_max_attempts_dead_letters_or_drops() -> None:
    sink = make(retry={"initial": 0.0, "max": 0.0, "max_attempts": 3})
    sink.failures["a"] = [SinkTransientError(f"t{i}") for i in range(5)]
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.DROPPED)]
    assert sink.attempts == ["a", "a", "a"]
    assert sink.stats.failed == 1
    await sink.close()


async def test_in_flight_window_blocks_deliver() -> None:
    sink = make(max_in_flight=2)
    sink.gate = asyncio.Event()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    await sink.deliver(event(EventType.ADDED, obj("b")), acks.cb("b"))
    third = asyncio.create_task(sink.deliver(event(EventType.ADDED, obj("c")), acks.cb("c")), name="third")
    await asyncio.sleep(0.01)
    assert not third.done()
    assert sink.stats.in_flight == 2
    assert not await sink.flush(0.01)
    sink.gate.set()
    await third
    assert await sink.flush(5)
    assert [label for label, _ in acks.outcomes] == ["a", "b", "c"]
    await sink.close()


async def test_close_releases_blocked_deliver_and_leaves_unacked() -> None:
    sink = make(max_in_flight=1)
    sink.gate = asyncio.Event()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    blocked = asyncio.create_task(
        sink.deliver(event(EventType.ADDED, obj("b")), acks.cb("b")), name="blocked"
    )
    await asyncio.sleep(0.01)
    await sink.close()
    with pytest.raises(SinkError, match="closed"):
        await blocked
    assert acks.outcomes == []
    with pytest.raises(SinkError, match="closed"):
        await sink.deliver(event(), acks.cb("late"))
    await sink.close()


async def test_snapshot_markers_frame_sync_events_even_with_retries() -> None:
    sink = make(retry={"initial": 0.0, "max": 0.0})
    sink.failures["s1"] = [SinkTransientError("x"), SinkTransientError("x")]
    snap = SnapshotInfo(id="snap-1", resource_version="100")
    acks = Acks()
    await sink.deliver(marker(EventType.SNAPSHOT_BEGIN, snap), acks.cb("begin"))
    for n in ("s1", "s2", "s3"):
        await sink.deliver(event(EventType.SYNC, obj(n), snapshot=snap), acks.cb(n))
    end = SnapshotInfo(id="snap-1", resource_version="100", count=3)
    await sink.deliver(marker(EventType.SNAPSHOT_END, end), acks.cb("end"))
    await sink.deliver(event(EventType.ADDED, obj("after")), acks.cb("after"))
    assert await sink.flush(5)
    order = [m.event.name or m.event.type.value for m in sink.sent]
    assert order[0] == "snapshot.begin"
    assert sorted(order[1:4]) == ["s1", "s2", "s3"]
    assert order[4:] == ["snapshot.end", "after"]
    assert sink.sent[0].key == b"snapshot/snap-1"
    await sink.close()


async def test_unencodable_object_is_dead_lettered_not_crashing(tmp_path: Path) -> None:
    sink = make(dead_letter={"kind": "file", "target": str(tmp_path / "dl.jsonl")})
    acks = Acks()
    bad = obj("bad", spec={1: "non-string key"})
    await sink.deliver(event(EventType.ADDED, bad), acks.cb("bad"))
    assert await sink.flush(5)
    assert acks.outcomes == [("bad", DeliveryOutcome.DEAD_LETTERED)]
    record = orjson.loads((tmp_path / "dl.jsonl").read_bytes())
    assert record["reason"].startswith("cannot encode event")
    assert sink.sent == []
    await sink.close()


def test_bad_config_messages() -> None:
    with pytest.raises(
        SinkConfigError, match=r"sink 'x' \(recording\): destination: unknown template field 'foo'"
    ):
        RecordingSink.from_options("x", {"destination": "a.{foo}"})
    with pytest.raises(SinkConfigError, match=r"dead_letter: kind 'kafka' is not supported by this sink"):
        RecordingSink.from_options("x", {"dead_letter": {"kind": "kafka", "target": "dlq"}})
    with pytest.raises(SinkConfigError, match=r"routing.label_selector: unable to parse requirement"):
        RecordingSink.from_options("x", {"routing": {"label_selector": "a in b"}})


def test_wiring_properties() -> None:
    options = {
        "routing": {"resources": ["Pods", "deployments.apps"]},
        "resync_period": 30,
        "buffer": {"capacity": 10, "policy": "coalesce"},
    }
    sink = RecordingSink.from_options("x", options)
    assert sink.delivery == DeliveryOptions(routing=frozenset({"pods", "deployments.apps"}),
                                            resync_period=30.0, buffer_capacity=10,
                                            overflow_policy=OverflowPolicy.COALESCE)
    assert delivery_options(options) == sink.delivery  # the same options, whatever the sink's kind
    assert sink.accepts(event(resource=PODS))


@pytest.mark.parametrize(("interval", "seconds"), [(30, 30.0), ("30s", 30.0), ("2m", 120.0), ("1h", 3600.0),
                                                 (0.5, 0.5)])
def test_heartbeat_interval(interval: object, seconds: float) -> None:
    options = {"heartbeat": {"interval": interval}}
    assert RecordingSink.from_options("x", options).delivery.heartbeat_interval == seconds
    assert delivery_options(options).heartbeat_interval == seconds
    assert RecordingSink.from_options("x", {}).delivery.heartbeat_interval == 0.0  # off by default


def test_bad_heartbeat_options_are_refused_naming_the_field() -> None:
    with pytest.raises(SinkConfigError, match=r"heartbeat.interval: .*not a duration: 'soons'"):
        RecordingSink.from_options("x", {"heartbeat": {"interval": "soons"}})
    with pytest.raises(SinkConfigError, match=r"heartbeat.interval: Input should be greater than 0"):
        RecordingSink.from_options("x", {"heartbeat": {"interval": "0s"}})
    with pytest.raises(SinkConfigError, match=r"heartbeat.interval: Field required"):
        RecordingSink.from_options("x", {"heartbeat": {}})
    with pytest.raises(SinkConfigError, match=r"heartbeat: compat 'knative' sends only events of objects"):
        RecordingSink.from_options("x", {"compat": "knative", "heartbeat": {"interval": "30s"}})


async def test_gives_up_after_max_elapsed_on_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    sink = make(
        clock=clock,
        retry={"initial": 4.0, "max": 4.0, "jitter": 0.0, "max_elapsed": 10.0},
        dead_letter={"kind": "file", "target": str(tmp_path / "dl.jsonl")},
    )
    sink.failures["a"] = [SinkTransientError("broker down") for _ in range(10)]
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    for _ in range(3):
        for _ in range(100):  # let the lane run up to its backoff sleep
            if clock.pending_sleepers:
                break
            await asyncio.sleep(0)
        await clock.advance(4.0)
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.DEAD_LETTERED)]
    reason = orjson.loads((tmp_path / "dl.jsonl").read_bytes())["reason"]
    assert reason == "gave up after 4 attempts over 12.0s: broker down"
    await sink.close()


async def test_random_failures_ack_every_event_once_in_per_object_order() -> None:
    rng = random.Random(7)
    sink = make(retry={"initial": 0.0, "max": 0.0}, max_in_flight=16)

    class Flaky(RecordingSink):
        async def _send(self, msg: OutgoingMessage) -> None:
            await asyncio.sleep(0)
            roll = rng.random()
            if roll < 0.3:
                raise SinkTransientError("flaky")
            self.sent.append(msg)

    flaky = Flaky(name="flaky", options=sink.options, rng=lambda: 0.5)
    await sink.close()
    acks = Acks()
    expected: dict[str, list[str]] = {}
    for i in range(400):
        name = f"o{rng.randrange(12)}"
        rv = str(i)
        expected.setdefault(name, []).append(rv)
        await flaky.deliver(event(EventType.UPDATED, obj(name, rv=rv)), acks.cb(f"{name}@{rv}"))
    assert await flaky.flush(10)
    labels = [label for label, _ in acks.outcomes]
    assert len(labels) == len(set(labels)) == 400
    assert {o for _, o in acks.outcomes} == {DeliveryOutcome.DELIVERED}
    got: dict[str, list[str]] = {}
    for m in flaky.sent:
        got.setdefault(m.event.name, []).append(m.event.resource_version)
    assert got == expected
    assert flaky.stats.retries > 50
    await flaky.close()


async def test_old_object_is_redacted_too_in_object_and_old_and_merge_patch() -> None:
    old = obj("creds", kind="Secret", rv="1", data={"pw": "b2xk"})
    new = obj("creds", kind="Secret", rv="2", data={"pw": "bmV3", "user": "dQ=="})
    for mode, expected in [
        (
            "object_and_old",
            {
                "object": {**new, "data": {"pw": "<redacted>", "user": "<redacted>"}},
                "oldObject": {**old, "data": {"pw": "<redacted>"}},
            },
        ),
        ("merge_patch", {"metadata": {"resourceVersion": "2"}, "data": {"user": "<redacted>"}}),
    ]:
        sink = make(payload=mode)
        acks = Acks()
        await sink.deliver(event(EventType.UPDATED, new, old=old, resource=SECRETS), acks.cb(mode))
        assert await sink.flush(5)
        (msg,) = sink.sent
        assert orjson.loads(msg.body)["data"] == expected, mode
        assert b"bmV3" not in msg.body
        assert b"b2xk" not in msg.body
        await sink.close()


class PipelinedSink(BaseSink[SinkOptions]):
    """A sink that pipelines like the Kafka and NATS sinks: ``_submit`` records the attempt and the
    test settles it whenever it likes (the destination's confirmation)."""

    kind = "pipelined"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.submitted: list[tuple[str, int]] = []
        self.open: dict[str, OutgoingMessage] = {}

    def _submit(self, msg: OutgoingMessage) -> None:
        label = msg.event.name or msg.event.type.value
        label = f"{label}@{msg.event.resource_version}" if msg.event.obj is not None else label
        self.submitted.append((label, msg.attempts))
        self.open[label] = msg

    def confirm(self, label: str, error: BaseException | None = None) -> None:
        self._settle(self.open.pop(label), error)


def pipelined(clock: FakeClock | None = None, **opts: Any) -> PipelinedSink:
    options = SinkOptions.from_mapping("pipe", {"retry": {"initial": 1.0, "max": 1.0, "jitter": 0.0}, **opts})
    return PipelinedSink(name="pipe", options=options, clock=clock, rng=lambda: 0.5)


async def test_pipelined_submit_keeps_per_object_order_without_a_task_per_event() -> None:
    clock = FakeClock()
    sink = pipelined(clock)
    acks = Acks()
    tasks_before = len(asyncio.all_tasks())
    for rv in ("1", "2", "3"):
        for name in ("a", "b"):
            await sink.deliver(event(EventType.UPDATED, obj(name, rv=rv), old=obj(name, rv="0", spec=rv)),
                               acks.cb(f"{name}@{rv}"))
    # One attempt in flight per object, submitted synchronously: no task was created for them.
    assert sink.submitted == [("a@1", 1), ("b@1", 1)]
    assert len(asyncio.all_tasks()) == tasks_before
    assert sink.stats.in_flight == 6
    sink.confirm("b@1")
    assert sink.submitted[-1] == ("b@2", 1)  # the object's next event starts at once
    sink.confirm("a@1", SinkTransientError("broker busy"))
    assert acks.outcomes == [("b@1", DeliveryOutcome.DELIVERED)]
    assert not sink.healthy()
    sink.confirm("b@2")
    sink.confirm("b@3")
    for _ in range(5):
        await asyncio.sleep(0)
    assert clock.next_deadline() == pytest.approx(clock.now() + 1.0)
    await clock.advance(1.0)
    assert sink.submitted[-1] == ("a@1", 2)  # retried first: a@2 is still waiting behind it
    sink.confirm("a@1")
    sink.confirm("a@2")
    sink.confirm("a@3")
    assert await sink.flush(1)
    assert [label for label, _ in acks.outcomes] == ["b@1", "b@2", "b@3", "a@1", "a@2", "a@3"]
    assert sink.healthy()
    assert sink.stats.retries == 1
    await sink.close()


async def test_pipelined_outcome_reported_twice_acks_once() -> None:
    sink = pipelined()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    msg = sink.open["a@1"]
    sink.confirm("a@1")
    sink._settle(msg, None)
    sink._settle(msg, SinkPermanentError("late report"))
    assert acks.outcomes == [("a", DeliveryOutcome.DELIVERED)]
    assert sink.stats.as_dict()["delivered"] == 1
    assert sink.stats.in_flight == 0
    await sink.close()


async def test_pipelined_markers_wait_for_everything_before_and_hold_everything_after() -> None:
    sink = pipelined()
    acks = Acks()
    snap = SnapshotInfo(id="s", resource_version="9")
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    await sink.deliver(marker(EventType.SNAPSHOT_BEGIN, snap), acks.cb("begin"))
    await sink.deliver(event(EventType.SYNC, obj("b"), snapshot=snap), acks.cb("b"))
    await sink.deliver(marker(EventType.SNAPSHOT_END, snap), acks.cb("end"))
    await sink.deliver(event(EventType.ADDED, obj("c")), acks.cb("c"))
    assert [label for label, _ in sink.submitted] == ["a@1"]
    sink.confirm("a@1")
    assert [label for label, _ in sink.submitted] == ["a@1", "snapshot.begin"]
    sink.confirm("snapshot.begin")
    assert [label for label, _ in sink.submitted] == ["a@1", "snapshot.begin", "b@1"]
    sink.confirm("b@1")
    sink.confirm("snapshot.end")
    assert [label for label, _ in sink.submitted][-1] == "c@1"
    sink.confirm("c@1")
    assert await sink.flush(1)
    assert [label for label, _ in acks.outcomes] == ["a", "begin", "b", "end", "c"]
    await sink.close()


async def test_submit_raising_counts_as_the_attempt(tmp_path: Path) -> None:
    class Refusing(PipelinedSink):
        def _submit(self, msg: OutgoingMessage) -> None:
            raise SinkPermanentError("record too large")

    options = SinkOptions.from_mapping("r", {"dead_letter": {"kind": "file", "target": str(tmp_path / "dl")}})
    sink = Refusing(name="r", options=options)
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.DEAD_LETTERED)]
    assert orjson.loads((tmp_path / "dl").read_bytes())["reason"] == "record too large"
    await sink.close()


async def test_sender_tasks_are_capped_and_reused() -> None:
    class TwoAtATime(RecordingSink):
        def _max_senders(self) -> int:
            return 2

    options = SinkOptions.from_mapping("two", {"max_in_flight": 10})
    sink = TwoAtATime(name="two", options=options)
    sink.gate = asyncio.Event()
    acks = Acks()
    for name in "abcdef":
        await sink.deliver(event(EventType.ADDED, obj(name)), acks.cb(name))
    await asyncio.sleep(0.01)
    assert sink.attempts == ["a", "b"]  # two senders, both waiting on the gate
    senders = [t for t in asyncio.all_tasks() if t.get_name() == "sink:two:sender"]
    assert len(senders) == 2
    sink.gate.set()
    assert await sink.flush(5)
    assert sorted(label for label, _ in acks.outcomes) == list("abcdef")
    assert sorted(sink.attempts) == list("abcdef")
    assert [t for t in asyncio.all_tasks() if t.get_name() == "sink:two:sender"] == []
    await sink.close()


async def test_message_envelope_is_the_one_sent_in_both_content_modes() -> None:
    from sinks.cloudevents import to_cloudevent

    for mode in ("structured", "binary"):
        sink = make(content_mode=mode)
        ev = event(EventType.UPDATED, obj("a", rv="2", labels={"team": "ö b"}), old=obj("a", rv="1"))
        acks = Acks()
        await sink.deliver(ev, acks.cb("a"))
        assert await sink.flush(5)
        (msg,) = sink.sent
        assert msg.cloudevent == to_cloudevent(ev, data=ev.obj), mode
        await sink.close()
