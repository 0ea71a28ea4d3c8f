"""``deliver_batch`` is ``deliver`` for each event in turn, only cheaper per event.

Two identical sinks, on the same fake clock settings, are fed the same events: one with a
``deliver`` call per event, the other with ``deliver_batch`` over the same events cut into batches.
A destination stand-in records every attempt the sink starts (the message exactly as it would go on
the wire) and confirms, fails or holds attempts by a fixed script, so the two runs must produce the
same attempts, in the same order, and the same acknowledgements. Hypothesis draws the events (few
objects, every event type, snapshot markers, objects kept as bytes or as dicts, with and without
managedFields), the batch cuts, the in-flight window and the options that change the message
(content mode, payload, key, compat, redaction, routing, change filter, destination template). The
brokers' own clients read back what the real sinks stored in ``test_deliver_batch_brokers.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.clock import FakeClock
from bridge.rawobject import RawObject
from sinks.base import BaseSink, OutgoingMessage
from sinks.contract import (
    AckCallback,
    BatchSink,
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    SinkError,
    SinkPermanentError,
    SinkTransientError,
    SnapshotInfo,
)
from sinks.options import SinkOptions
from tests.sinks import NODES, PODS, SECRETS, T0, Acks, event, marker, obj

Attempt = tuple[str, int, bytes, str, tuple[tuple[str, str], ...], bytes, str, str]


class ScriptedSink(BaseSink[SinkOptions]):
    """Records each attempt as it would be sent; the test settles attempts through :meth:`step`."""

    kind = "scripted"

    def __init__(self, failures: dict[str, list[str]] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.attempts: list[Attempt] = []
        self.open: list[OutgoingMessage] = []
        self.failures = {k: list(v) for k, v in (failures or {}).items()}
        """Per event label: the outcomes of its first attempts (``transient`` / ``permanent``)."""

    def _submit(self, msg: OutgoingMessage) -> None:
        self.attempts.append((
            label(msg.event), msg.attempts, msg.key, msg.destination, tuple(sorted(msg.headers.items())),
            msg.body, msg.lane, msg.event_id,
        ))
        self.open.append(msg)

    def _sanitize(self, value: str) -> str:
        return value.replace("-", "_").upper() or "_"

    def step(self) -> bool:
        """Settles the oldest open attempt by the script; False when none is open."""
        if not self.open:
            return False
        msg = self.open.pop(0)
        script = self.failures.get(label(msg.event))
        result: BaseException | None = None
        if script:
            what = script.pop(0)
            result = SinkTransientError("busy") if what == "transient" else SinkPermanentError("no")
        self._settle(msg, result)
        return True


def label(ev: ChangeEvent) -> str:
    if ev.obj is None:
        snap = ev.snapshot
        return f"{ev.type.value}:{snap.id if snap else ''}"
    return f"{ev.name}@{ev.resource_version}:{ev.type.value}"


def make(clock: FakeClock, failures: dict[str, list[str]] | None = None, **opts: Any) -> ScriptedSink:
    options = SinkOptions.from_mapping("scripted", {
        "retry": {"initial": 1.0, "max": 1.0, "jitter": 0.0, "max_attempts": 3}, **opts})
    return ScriptedSink(failures, name="scripted", options=options, clock=clock, rng=lambda: 0.5)


async def run_through(sink: ScriptedSink, clock: FakeClock, events: Sequence[ChangeEvent],
                      cuts: Sequence[int] | None) -> tuple[list[tuple[str, DeliveryOutcome]], list[int]]:
    """Feeds ``events`` (per event when ``cuts`` is None, else in batches ending at ``cuts``) while
    the destination settles one attempt per loop turn; returns the acks and the in-flight counts
    seen at every attempt."""
    acks = Acks()
    labels = [f"{i}:{label(ev)}" for i, ev in enumerate(events)]
    in_flight: list[int] = []

    async def feed() -> None:
        if cuts is None:
            for ev, name in zip(events, labels, strict=True):
                await sink.deliver(ev, acks.cb(name))
            return
        start = 0
        for end in [*cuts, len(events)]:
            await sink.deliver_batch(events[start:end], [acks.cb(n) for n in labels[start:end]])
            start = end

    feeder = asyncio.get_running_loop().create_task(feed())
    for _ in range(100_000):
        await asyncio.sleep(0)
        in_flight.append(sink.stats.in_flight)
        if sink.step():
            continue
        if feeder.done() and sink.stats.in_flight == 0:
            break
        if clock.next_deadline() is not None:
            await clock.advance(clock.next_deadline() - clock.now())  # type: ignore[operator]
    await feeder
    assert sink.stats.in_flight == 0
    return acks.outcomes, in_flight


async def twins(events: Sequence[ChangeEvent], cuts: Sequence[int], *,
                failures: dict[str, list[str]] | None = None,
                **opts: Any) -> tuple[ScriptedSink, list[tuple[str, DeliveryOutcome]], list[int]]:
    """Runs both ways; asserts the attempts, acks and stats are equal; returns the batch run's."""
    one_clock, batch_clock = FakeClock(), FakeClock()
    one = make(one_clock, failures, **opts)
    batch = make(batch_clock, failures, **opts)
    acks_one, _ = await run_through(one, one_clock, events, None)
    acks_batch, in_flight = await run_through(batch, batch_clock, events, cuts)
    assert batch.attempts == one.attempts
    assert acks_batch == acks_one
    assert batch.stats.as_dict() == one.stats.as_dict()
    await one.close()
    await batch.close()
    return batch, acks_batch, in_flight


# ---- generated runs --------------------------------------------------------------------------------

NAMES = ("a", "b", "c")
MF = [{"manager": "kubectl", "operation": "Update", "time": "2024-05-01T12:00:00Z", "fieldsV1": {}}]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ChangeEvent], list[int], dict[str, list[str]], dict[str, Any]]:
    count = draw(st.integers(1, 30))
    rv = 0
    state: dict[str, dict[str, Any]] = {}
    events: list[ChangeEvent] = []
    snap_open: SnapshotInfo | None = None
    snaps = 0
    as_raw = draw(st.sampled_from(["dict", "raw", "mixed"]))
    for _ in range(count):
        kind = draw(st.sampled_from(["change", "change", "change", "marker"]))
        if kind == "marker":
            if snap_open is None:
                snaps += 1
                snap_open = SnapshotInfo(id=f"s{snaps}", resource_version=str(rv))
                events.append(marker(EventType.SNAPSHOT_BEGIN, snap_open))
            else:
                end = SnapshotInfo(id=snap_open.id, resource_version=str(rv), count=1)
                events.append(marker(EventType.SNAPSHOT_END, end))
                snap_open = None
            continue
        name = draw(st.sampled_from(NAMES))
        rv += 1
        namespace = draw(st.sampled_from(["default", "default", "kube-system", None]))
        extra: dict[str, Any] = {"spec": {"n": draw(st.integers(0, 2))}}
        if draw(st.booleans()):
            extra["status"] = {"phase": draw(st.sampled_from(["Pending", "Running"]))}
        new = obj(name, namespace=namespace, rv=str(rv), labels={"app": draw(st.sampled_from(["web", "db"]))},
                  **extra)
        if draw(st.integers(0, 4)) == 0:
            new["metadata"]["managedFields"] = MF
        raw = as_raw == "raw" or (as_raw == "mixed" and draw(st.booleans()))
        resource = NODES if namespace is None else draw(st.sampled_from([PODS, PODS, SECRETS]))
        old = state.get(name)
        type_ = draw(st.sampled_from([EventType.ADDED, EventType.UPDATED, EventType.DELETED, EventType.SYNC]))
        if type_ is EventType.UPDATED and old is None:
            type_ = EventType.ADDED
        kw: dict[str, Any] = {}
        if type_ is EventType.SYNC:
            kw["snapshot"] = snap_open or SnapshotInfo(id="free", resource_version=str(rv))
        if draw(st.integers(0, 5)) == 0:
            kw["extensions"] = {"leftselector": "true"} if type_ is EventType.DELETED else {"team": "x"}
        state[name] = new

        def conv(o: dict[str, Any] | None, raw: bool = raw) -> Any:
            return RawObject.from_dict(o) if raw and o is not None else o

        when = draw(st.sampled_from([T0, T0, T0 + 0.5, T0 + 1.0]))
        events.append(event(type_, conv(new), old=conv(old) if type_ is EventType.UPDATED else None,
                            resource=resource, time=when, **kw))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(events) - 1)), max_size=6))))
    failures: dict[str, list[str]] = {}
    for ev in draw(st.lists(st.sampled_from(events), max_size=4)):
        outcomes = st.sampled_from(["transient", "permanent"])
        failures[label(ev)] = draw(st.lists(outcomes, min_size=1, max_size=3))
    opts: dict[str, Any] = {"max_in_flight": draw(st.sampled_from([1, 2, 3, 100]))}
    if draw(st.booleans()):
        opts["content_mode"] = "binary"
    opts["payload"] = draw(st.sampled_from(["object", "object", "object_and_old", "merge_patch"]))
    if draw(st.booleans()):
        opts["key"] = "namespace/name"
    if draw(st.integers(0, 4)) == 0 and opts["payload"] == "object":
        opts["compat"] = "knative"
    opts["destination"] = draw(st.sampled_from([
        "k8s.{resource}", "k8s.{namespace}.{name}.{labels[app]}",
        "{cluster}/{group}/{version}/{resource}/{kind}/{namespace}/{name}/{uid}"]))
    if draw(st.integers(0, 3)) == 0:
        opts["redact"] = {"paths": ["spec.n"]}
    if draw(st.integers(0, 3)) == 0:
        opts["redact"] = {"managed_fields": "keep"}
    if draw(st.integers(0, 3)) == 0:
        opts["routing"] = {"namespaces": ["default"], "label_selector": "app=web"}
    if draw(st.integers(0, 3)) == 0:
        opts["change_filter"] = {"ignore_paths": ["metadata.resourceVersion", "status"]}
    return events, cuts, failures, opts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_batches_equal_per_event_delivery(
    scenario: tuple[list[ChangeEvent], list[int], dict[str, list[str]], dict[str, Any]],
) -> None:
    events, cuts, failures, opts = scenario

    async def check() -> None:
        sink, acks, in_flight = await twins(events, cuts, failures=failures, **opts)
        # Each event acknowledged exactly once.
        assert sorted(int(name.split(":", 1)[0]) for name, _ in acks) == list(range(len(events)))
        assert max(in_flight) <= opts["max_in_flight"]
        check_order_and_barriers(events, sink.attempts)

    asyncio.run(check())


def raw(o: dict[str, Any]) -> Any:
    """The object kept as bytes, as the compact cache hands it to sinks."""
    return RawObject.from_dict(o)


def check_order_and_barriers(events: Sequence[ChangeEvent], attempts: Sequence[Attempt]) -> None:
    """First attempts: one object's events in delivery order; a marker after everything accepted
    before it and before everything accepted after it."""
    position = {label(ev): i for i, ev in enumerate(events)}
    firsts = [position[a[0]] for a in attempts if a[1] == 1]
    by_lane: dict[str, list[int]] = {}
    for a in attempts:
        if a[1] == 1 and not a[0].startswith("snapshot"):
            by_lane.setdefault(a[6], []).append(position[a[0]])
    for order in by_lane.values():
        assert order == sorted(order)
    for i, index in enumerate(firsts):
        if events[index].obj is None:
            assert all(j < index for j in firsts[:i])
            assert all(j > index for j in firsts[i + 1:])


# ---- the contract, one rule at a time --------------------------------------------------------------


async def test_the_envelope_is_byte_identical_for_every_kind_of_object() -> None:
    mf = obj("m", rv="9", spec={"x": 1})
    mf["metadata"]["managedFields"] = MF
    events = [
        event(EventType.ADDED, raw(obj("a", rv="1", labels={"app": "web"}))),
        event(EventType.UPDATED, raw(obj("a", rv="2", spec={"x": 2})),
              old=raw(obj("a", rv="1"))),
        event(EventType.ADDED, obj("b", rv="3")),
        event(EventType.ADDED, raw(mf)),
        event(EventType.DELETED, raw(obj("a", rv="4"))),
        event(EventType.DELETED, raw(obj("c", rv="5")), extensions={"leftselector": "true"}),
        event(EventType.ADDED, raw(obj("n", namespace=None, rv="6", kind="Node")), resource=NODES),
        event(EventType.ADDED, raw(obj("s", rv="7", kind="Secret", data={"k": "c2VjcmV0"})),
              resource=SECRETS),
        event(EventType.SYNC, raw(obj("a", rv="8")),
              snapshot=SnapshotInfo(id="x", resource_version="8", shard=0, total_shards=2),
              final_state_unknown=True, extensions={"Team-Name": "x"}),
        event(EventType.ADDED, raw(obj("t", rv="10")), time=0.0 + T0, cluster="other"),
    ]
    for opts in ({}, {"content_mode": "binary"}, {"key": "namespace/name"},
                 {"destination": "{cluster}.{name}"},
                 {"compat": "knative"}, {"compat": "knative", "knative_mode": "reference"},
                 {"payload": "merge_patch"}, {"payload": "object_and_old"}, {"redact": {"paths": ["spec.x"]}},
                 {"redact": {"managed_fields": "keep"}}):
        sink, acks, _ = await twins(events, [3, 4, 7], **opts)
        assert len(sink.attempts) == len(events), opts
        assert {outcome for _, outcome in acks} == {DeliveryOutcome.DELIVERED}


async def test_filtered_events_are_acked_filtered_in_their_place() -> None:
    web = raw(obj("w", rv="1", labels={"app": "web"}, status={"phase": "Pending"}))
    status_only = raw(obj("w", rv="2", labels={"app": "web"}, status={"phase": "Running"}))
    events = [
        event(EventType.ADDED, obj("x", namespace="kube-system")),
        event(EventType.ADDED, web),
        event(EventType.UPDATED, status_only, old=web),
        event(EventType.ADDED, obj("y", labels={"app": "db"})),
    ]
    _, acks, _ = await twins(events, [1, 2], routing={"namespaces": ["default"], "label_selector": "app=web"},
                             change_filter={"ignore_paths": ["metadata.resourceVersion", "status"]})
    assert [o for _, o in acks].count(DeliveryOutcome.FILTERED) == 3
    knative = [marker(EventType.SNAPSHOT_BEGIN, SnapshotInfo("s", "1")), event(EventType.ADDED, obj("a"))]
    _, acks, _ = await twins(knative, [], compat="knative")
    assert acks[0] == ("0:snapshot.begin:s", DeliveryOutcome.FILTERED)


async def test_a_marker_in_a_batch_waits_for_everything_before_and_holds_everything_after() -> None:
    snap = SnapshotInfo(id="s1", resource_version="5")
    events = [
        event(EventType.ADDED, raw(obj("a", rv="1"))),
        event(EventType.ADDED, raw(obj("b", rv="2"))),
        marker(EventType.SNAPSHOT_BEGIN, snap),
        event(EventType.SYNC, raw(obj("a", rv="1")), snapshot=snap),
        marker(EventType.SNAPSHOT_END, SnapshotInfo(id="s1", resource_version="5", count=1)),
        event(EventType.UPDATED, raw(obj("b", rv="6", spec={"x": 1})),
              old=raw(obj("b", rv="2"))),
    ]
    clock = FakeClock()
    sink = make(clock)
    acks = Acks()
    await sink.deliver_batch(events, [acks.cb(str(i)) for i in range(len(events))])
    # Only what precedes the marker started; the marker waits for both.
    assert [a[0] for a in sink.attempts] == ["a@1:added", "b@2:added"]
    sink.step()
    sink.step()
    assert [a[0] for a in sink.attempts][2:] == ["snapshot.begin:s1"]
    sink.step()
    assert [a[0] for a in sink.attempts][3:] == ["a@1:sync"]
    sink.step()
    assert [a[0] for a in sink.attempts][4:] == ["snapshot.end:s1"]
    sink.step()
    assert [a[0] for a in sink.attempts][5:] == ["b@6:updated"]
    while sink.step():
        pass
    assert [name for name, _ in acks.outcomes] == [str(i) for i in range(6)]
    await sink.close()


async def test_a_full_window_blocks_the_batch_between_events() -> None:
    clock = FakeClock()
    sink = make(clock, max_in_flight=2)
    acks = Acks()
    events = [event(EventType.ADDED, raw(obj(f"p{i}", rv=str(i)))) for i in range(5)]
    task = asyncio.get_running_loop().create_task(
        sink.deliver_batch(events, [acks.cb(str(i)) for i in range(5)]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    assert sink.stats.in_flight == 2
    assert [a[0] for a in sink.attempts] == ["p0@0:added", "p1@1:added"]
    sink.step()
    for _ in range(3):
        await asyncio.sleep(0)
    assert sink.stats.in_flight == 2  # room for exactly one more
    assert len(sink.attempts) == 3
    while not task.done() or sink.open:
        sink.step()
        await asyncio.sleep(0)
    await task
    assert [name for name, _ in acks.outcomes] == ["0", "1", "2", "3", "4"]
    await sink.close()


async def test_closing_while_the_batch_waits_raises_and_keeps_what_was_accepted() -> None:
    clock = FakeClock()
    sink = make(clock, max_in_flight=1)
    acks = Acks()
    events = [event(EventType.ADDED, obj(f"p{i}")) for i in range(3)]
    task = asyncio.get_running_loop().create_task(
        sink.deliver_batch(events, [acks.cb(str(i)) for i in range(3)]))
    for _ in range(3):
        await asyncio.sleep(0)
    assert sink.stats.accepted == 1
    await sink.close()
    with pytest.raises(SinkError, match="closed"):
        await task
    assert acks.outcomes == []  # accepted but unacked, as close promises
    with pytest.raises(SinkError, match="closed"):
        await sink.deliver_batch(events[:1], [acks.cb("late")])


async def test_empty_batch_is_a_no_op_and_lengths_must_match() -> None:
    clock = FakeClock()
    sink = make(clock)
    await sink.deliver_batch([], [])
    assert sink.stats.as_dict()["accepted"] == 0
    with pytest.raises(ValueError, match="2 events but 1 acks"):
        await sink.deliver_batch([event(), event()], [lambda _o: None])
    assert sink.attempts == []
    await sink.close()


async def test_an_ack_raising_does_not_stop_the_batch() -> None:
    clock = FakeClock()
    sink = make(clock)
    seen: list[str] = []

    def bad(_outcome: DeliveryOutcome) -> None:
        raise RuntimeError("consumer bug")

    ok: AckCallback = lambda _outcome: seen.append("ok")  # noqa: E731
    await sink.deliver_batch([event(EventType.ADDED, obj("a")), event(EventType.ADDED, obj("b"))], [bad, ok])
    while sink.step():
        pass
    assert seen == ["ok"]
    await sink.close()


def test_every_built_in_sink_takes_batches() -> None:
    from sinks.file import FileSink, StdoutSink
    from sinks.kafka import KafkaSink
    from sinks.nats import JetStreamSink, NatsSink
    from sinks.webhook import WebhookSink

    for cls in (FileSink, StdoutSink, KafkaSink, NatsSink, JetStreamSink, WebhookSink):
        assert callable(getattr(cls, "deliver_batch", None)), cls
    assert "deliver_batch" in dir(BatchSink)
