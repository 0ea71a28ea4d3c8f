"""Issue #18: ``SinkListener.handle_batch`` hands the sink a batch's events in one call, and behaves
exactly as one ``handle`` call per notification: same events in the same order, one ack each, the
known-object journal's wait, the bootstrap and own-progress filters, a failing sink.

The equivalence table runs each scenario through two listeners (one ``handle`` per notification, and
``handle_batch``) and compares what their sinks received and what was acknowledged; the end-to-end
tests run the pipeline over a real file sink, and a real Kafka broker, with the file checkpoint store
(journal included)."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.clock import FakeClock, RealClock
from bridge.contracts import (
    AckFunc,
    BatchInterrupted,
    DeletedFinalStateUnknown,
    Gap,
    Notification,
    NotificationKind,
    ObjectKey,
)
from bridge.delivery.journal import KnownObjectJournal
from bridge.delivery.pipeline import BridgePipeline, SinkListener
from bridge.delivery.replay import ReplayStage, SinkResume
from bridge.delivery.resume_plan import RelistedState, SentDelete
from bridge.delivery.selector_exit import SelectorExits
from bridge.errors import NotFoundError
from bridge.storage.checkpoint import FileCheckpointStore
from bridge.testing.fake_source import FakeControllerSource
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, SinkError
from sinks.file import FileSink
from sinks.kafka import KafkaSink
from tests import brokers
from tests.brokers import TansuBroker, unique_name
from tests.checkpoint.helpers import CONFIGMAPS, WATCHED, BatchSink, RecordingSink, cm, fake_builder, until

kafka_broker = brokers.kafka_broker


def obj(name: str, rv: str, uid: str = "") -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": uid or f"u-{name}", "resourceVersion": rv}}


def add(seq: int, name: str, rv: str) -> Notification:
    return Notification(kind=NotificationKind.ADD, obj=obj(name, rv), seq=seq, key=ObjectKey(f"ns/{name}"),
                        time=1000.0)


def upd(seq: int, name: str, old: str, rv: str) -> Notification:
    return Notification(kind=NotificationKind.UPDATE, obj=obj(name, rv), old=obj(name, old), seq=seq,
                        key=ObjectKey(f"ns/{name}"), is_resync=old == rv, time=1000.0)


def dele(seq: int, name: str, rv: str, tombstone: bool = False) -> Notification:
    o: Any = obj(name, rv)
    if tombstone:
        o = DeletedFinalStateUnknown(key=ObjectKey(f"ns/{name}"), obj=o)
    return Notification(kind=NotificationKind.DELETE, obj=o, seq=seq, key=ObjectKey(f"ns/{name}"),
                        time=1000.0)


def gap(seq: int, end: bool) -> Notification:
    return Notification(kind=NotificationKind.GAP, obj={}, seq=seq, time=1000.0,
                        gap=Gap(id="g1", from_resource_version="3", to_resource_version="9" if end else "",
                                end=end))


def snap(seq: int, *objects: dict[str, object]) -> Notification:
    return Notification(kind=NotificationKind.SNAPSHOT, obj={}, seq=seq, snapshot=list(objects),
                        resource_version="50", time=1000.0)


def seen(sink: RecordingSink) -> list[tuple[Any, ...]]:
    return [(e.type.value, e.subject, e.resource_version, e.final_state_unknown,
             e.gap.id if e.gap is not None else "", dict(e.extensions)) for e in sink.events]


def make(sink: RecordingSink, **kw: Any) -> SinkListener:
    return SinkListener(sink=sink, resource=CONFIGMAPS, cluster="c", clock=FakeClock(), **kw)


def acker(log: list[int], seq: int) -> AckFunc:
    return lambda: log.append(seq)


async def one_by_one(listener: SinkListener, ns: Sequence[Notification], log: list[int]) -> None:
    for n in ns:
        await listener.handle(n, acker(log, n.seq))


async def batched(listener: SinkListener, ns: Sequence[Notification], log: list[int]) -> None:
    await listener.handle_batch(ns, [acker(log, n.seq) for n in ns])


def plain() -> list[Notification]:
    return [add(0, "a", "1"), upd(1, "a", "1", "2"), add(2, "b", "3"), upd(3, "a", "2", "2"),
            upd(4, "b", "3", "4"), dele(5, "a", "5"), add(6, "a", "6")]


def with_markers() -> list[Notification]:
    return [add(0, "a", "1"), gap(1, False), upd(2, "a", "1", "7"), dele(3, "b", "2", tombstone=True),
            gap(4, True), upd(5, "a", "7", "10"), snap(6, obj("a", "10")), add(7, "c", "11")]


def exits(alive: dict[str, str]) -> SelectorExits:
    """A selector's exits answered from ``alive`` (name → resourceVersion it has now; others gone)."""

    async def fetch(namespace: str, name: str, at: str) -> dict[str, object]:
        if at or name not in alive:  # a name gone now was gone at its delete too
            raise NotFoundError(f"{name} not found", code=404)
        return obj(name, alive[name])

    return SelectorExits(fetch=fetch, attempts=1)


SCENARIOS: dict[str, tuple[Callable[[], list[Notification]], Callable[[], dict[str, Any]]]] = {
    "plain changes, a resync update, a delete and a re-creation": (plain, dict),
    "gap window, tombstone, snapshot inside the batch": (with_markers, dict),
    "bootstrapping: skipped until its snapshot, then live": (
        lambda: [upd(0, "a", "1", "2"), gap(1, False), add(2, "b", "3"), gap(3, True),
                 snap(4, obj("a", "2"), obj("b", "3")), upd(5, "a", "2", "6"), add(6, "c", "7")],
        lambda: {"bootstrap": lambda: None}),
    "own progress: what the sink had is skipped, the rest delivered": (
        lambda: [upd(0, "a", "3", "4"), upd(1, "a", "4", "6"), add(2, "b", "7"), dele(3, "x", "8"),
                 upd(4, "b", "7", "9")],
        lambda: {"replay": ReplayStage(own=SinkResume(
            resource_version=2, known={"ns/a": ("u-a", 5, False), "ns/x": ("u-x", 1, True)}))}),
    "replayed after an inferred delete: held back, the delete framed": (
        lambda: [upd(0, "a", "1", "2"), upd(1, "a", "2", "5"), dele(2, "a", "6"), add(3, "b", "7")],
        lambda: {"replay": ReplayStage(sent={"u-a": SentDelete("ns/a", "3", inferred=True)})}),
    "replayed after a relist sent the object: coalesced changes held back, its state framed": (
        lambda: [upd(0, "a", "1", "2"), upd(1, "a", "2", "3"), upd(2, "a", "3", "5"), add(3, "b", "6"),
                 upd(4, "a", "5", "7")],
        lambda: {"replay": ReplayStage(relisted={"u-a": RelistedState("2", "5", added=False)})}),
    "under a selector: exits asked, a replayed history of a uid that lives on": (
        lambda: [upd(0, "a", "1", "2"), upd(1, "a", "2", "5"), dele(2, "a", "6"), add(3, "b", "7"),
                 dele(4, "b", "8"), add(5, "c", "9"), dele(6, "c", "10")],
        lambda: {"replay": ReplayStage(sent={"u-a": SentDelete("ns/a", "3", inferred=True)},
                                       exits=(e := exits({"a": "12", "b": "8"}))), "exits": e}),
    "under a selector, nothing resent: deletes asked whether they were exits": (
        lambda: [add(0, "b", "7"), upd(1, "b", "7", "9"), dele(2, "b", "10"), add(3, "c", "11"),
                 dele(4, "c", "12")],
        lambda: {"exits": exits({"b": "10"})}),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("with_deliver_batch", [True, False])
async def test_a_batch_is_handled_as_one_call_per_notification(name: str, with_deliver_batch: bool) -> None:
    build, options = SCENARIOS[name]
    single_sink = RecordingSink("one")
    batch_sink = BatchSink("b") if with_deliver_batch else RecordingSink("b")
    single, batch = make(single_sink, **options()), make(batch_sink, **options())
    for lst in (single, batch):
        lst.bootstrap_ready()
    single_acks: list[int] = []
    batch_acks: list[int] = []
    await one_by_one(single, build(), single_acks)
    await batched(batch, build(), batch_acks)
    assert seen(batch_sink) == seen(single_sink)
    assert sorted(batch_acks) == sorted(single_acks) == [n.seq for n in build()]
    assert batch.stats.events == single.stats.events
    assert batch.stats.notifications == single.stats.notifications
    assert batch.stats.outcomes == single.stats.outcomes
    assert batch.stats.resync_skipped == single.stats.resync_skipped
    assert batch.stats.bootstrap_skipped == single.stats.bootstrap_skipped
    assert batch.stats.own_progress_skipped == single.stats.own_progress_skipped


async def test_plain_changes_reach_the_sink_in_one_call_each_event_acked_once() -> None:
    sink = BatchSink("b", auto_ack=False)
    lst = make(sink)
    acks: list[int] = []
    ns = [add(i, f"o{i}", str(i + 1)) for i in range(20)]
    await batched(lst, ns, acks)
    assert sink.calls == [20]
    assert acks == []
    for _event, ack in sink.unacked:
        ack(DeliveryOutcome.DELIVERED)
        ack(DeliveryOutcome.DEAD_LETTERED)  # a second ack of one event counts once
    assert acks == list(range(20))
    assert dict(lst.stats.outcomes) == {"delivered": 20}


async def test_a_marker_splits_the_batch_and_keeps_its_place() -> None:
    sink = BatchSink("b")
    lst = make(sink)
    ns = [add(0, "a", "1"), add(1, "b", "2"), gap(2, False), add(3, "c", "3"), gap(4, True)]
    await batched(lst, ns, [])
    assert sink.calls == [2, 1]  # the markers go through ``deliver`` on their own
    assert [e[0] for e in seen(sink)] == ["added", "added", "gap.begin", "added", "gap.end"]
    assert seen(sink)[3][4] == "g1"  # the change inside the window carries it


async def test_the_journal_holds_a_new_object_and_everything_after_it(tmp_path: Path) -> None:
    backend = FileCheckpointStore(directory=tmp_path).journal_backend("cm")
    journal = KnownObjectJournal(informer_id="cm", backend=backend, clock=RealClock())
    first = add(0, "a", "1")
    journal.note(first, inferred=False)
    writer = asyncio.create_task(journal.run(), name="test-journal")
    await until(lambda: not journal.must_wait(0), what="first record durable")
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    ns = [first, upd(1, "a", "1", "2"), add(2, "b", "3"), upd(3, "a", "2", "4")]
    for n in ns[1:]:
        journal.note(n, inferred=False)
    assert journal.must_wait(2)
    sink = BatchSink("b")
    handed: list[tuple[str, bool]] = []
    real = sink.deliver

    async def deliver(event: ChangeEvent, ack: AckCallback) -> None:
        handed.append((event.resource_version, journal.must_wait(3)))
        await real(event, ack)

    sink.deliver = deliver  # type: ignore[method-assign]
    lst = make(sink, journal=journal)
    acks: list[int] = []
    task = asyncio.create_task(batched(lst, ns, acks))
    for _ in range(50):
        await asyncio.sleep(0)
    assert handed == [("1", True)]  # durable already: handed over; the rest waits for b's record
    writer = asyncio.create_task(journal.run(), name="test-journal")
    await asyncio.wait_for(task, 10)
    assert handed == [("1", True), ("2", False), ("3", False), ("4", False)]
    assert sink.calls == [1, 3]
    assert sorted(acks) == [0, 1, 2, 3]
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


class FailingSink(BatchSink):
    """Raises on the batch holding an event of ``bad`` (as a closed sink would on any)."""

    def __init__(self, name: str, bad: str) -> None:
        super().__init__(name)
        self.bad = bad

    async def deliver_batch(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback]) -> None:
        if any(e.name == self.bad for e in events):
            raise SinkError("sink is closed")
        await super().deliver_batch(events, acks)


async def test_a_sink_failing_a_batch_has_each_of_its_notifications_acked() -> None:
    sink = FailingSink("b", bad="b")
    lst = make(sink)
    acks: list[int] = []
    ns = [add(0, "a", "1"), add(1, "b", "2"), add(2, "c", "3")]
    with pytest.raises(BatchInterrupted) as caught:
        await batched(lst, ns, acks)
    assert caught.value.index == 2  # the last notification looked at; the listener goes on after it
    assert isinstance(caught.value.__cause__, SinkError)
    assert acks == [0, 1, 2]
    assert sink.events == []


async def test_per_object_order_and_every_ack_end_to_end_through_a_file_sink(tmp_path: Path) -> None:
    """The pipeline over a real file sink and the file checkpoint store (its journal holds every new
    object's event until durable): creates, bursts of updates and deletes of 40 objects."""
    source = FakeControllerSource()
    clock = RealClock()
    out = tmp_path / "events.jsonl"
    sink = FileSink.from_options("file", {"path": str(out)})
    p = BridgePipeline(resources=[WATCHED], sinks=[sink],
                       checkpoint_store=FileCheckpointStore(directory=tmp_path / "checkpoints"),
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill", outage_check_interval=0)
    await p.start()
    try:
        assert await p.wait_for_sync(5)
        last: dict[str, str] = {}
        for round_ in range(6):
            for i in range(40):
                name = f"o{i}"
                if round_ == 0 or (round_ == 3 and i % 4 == 0):
                    created = source.add(cm(name, ns="ns", v=str(round_)))
                    last[name] = created["metadata"]["resourceVersion"]
                elif round_ == 2 and i % 4 == 0:
                    source.delete(cm(name, ns="ns"))
                    last[name] = "deleted"
                else:
                    changed = source.modify(cm(name, ns="ns", v=str(round_)))
                    last[name] = changed["metadata"]["resourceVersion"]
            await asyncio.sleep(0)  # one burst per round: the listener finds many ready at once
        tracker = p.tracker(WATCHED.informer_id)
        await until(lambda: tracker.pending == 0 and tracker.lag == 0, what="every event acknowledged")
    finally:
        await p.shutdown(5)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    per_object: dict[str, list[tuple[str, int]]] = {}
    for e in lines:
        if e["type"].endswith(("added", "updated", "deleted")):
            name = e["subject"].rsplit("/", 1)[-1]
            per_object.setdefault(name, []).append((e["type"].rsplit(".", 1)[-1],
                                                    int(e["data"]["metadata"]["resourceVersion"])))
    assert len(per_object) == 40
    for name, history in per_object.items():
        rvs = [rv for _, rv in history]
        assert rvs == sorted(rvs), f"{name} out of order: {history}"
        assert len(set(rvs)) == len(rvs), f"{name} delivered twice: {history}"
        kind, rv = history[-1]
        assert str(rv) == last[name] or (last[name] == "deleted" and kind == "deleted"), (name, history)
    assert len(lines) == 40 * 6


class Forwarding:
    """A wrapper forwarding unknown attributes to its sink, with a ``deliver`` of its own and no
    ``deliver_batch`` (as the service's fencing wrapper): its ``deliver`` must not be bypassed."""

    def __init__(self, inner: BatchSink) -> None:
        self.inner = inner
        self.name = inner.name
        self.passed: list[str] = []

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        self.passed.append(event.resource_version)
        await self.inner.deliver(event, ack)


async def test_a_wrapper_without_deliver_batch_gets_each_event_through_its_deliver() -> None:
    inner = BatchSink("b")
    wrapper = Forwarding(inner)
    lst = SinkListener(sink=wrapper, resource=CONFIGMAPS, cluster="c", clock=FakeClock())
    acks: list[int] = []
    await batched(lst, [add(0, "a", "1"), add(1, "b", "2"), add(2, "c", "3")], acks)
    assert wrapper.passed == ["1", "2", "3"]
    assert inner.calls == []  # never reached around the wrapper
    assert acks == [0, 1, 2]


@pytest.mark.timeout(120)
async def test_a_burst_through_kafka_arrives_complete_and_in_order_per_object(
        kafka_broker: TansuBroker, tmp_path: Path) -> None:
    """2,000 changes of 40 objects made at once (the listener takes them in batches) through the
    Kafka sink to a real broker (Tansu), the checkpoint store's journal included: read back, every
    change of every object once, in order, and every notification acknowledged."""
    topic = unique_name("batch")
    kafka_broker.create_topic(topic, partitions=3)
    source = FakeControllerSource()
    for i in range(40):
        source.add(cm(f"o{i}", v="0"))
    clock = RealClock()
    kafka = KafkaSink.from_options("kafka", {"brokers": kafka_broker.bootstrap, "destination": topic})
    p = BridgePipeline(resources=[WATCHED], sinks=[kafka],
                       checkpoint_store=FileCheckpointStore(directory=tmp_path / "checkpoints"),
                       build_informer=fake_builder(source, clock), clock=clock,
                       spill_directory=tmp_path / "spill", outage_check_interval=0)
    sent: dict[str, list[str]] = collections.defaultdict(list)
    await p.start()
    try:
        assert await p.wait_for_sync(10)
        for n in range(2000):
            stored = source.modify(cm(f"o{n % 40}", v=str(n + 1)))
            sent[f"default/o{n % 40}"].append(str(stored["metadata"]["resourceVersion"]))
            if n % 500 == 499:
                await asyncio.sleep(0)
        tracker = p.tracker(WATCHED.informer_id)
        await until(lambda: tracker.pending == 0 and tracker.lag == 0, timeout=60,
                    what="every change acknowledged")
    finally:
        await p.shutdown(30)
    records = await asyncio.to_thread(kafka_broker.read_all, topic, expect=2040, timeout=60)
    got: dict[str, list[str]] = collections.defaultdict(list)
    ids = set()
    for r in records:
        ce: dict[str, Any] = orjson.loads(r.value or b"")
        ids.add(ce["id"])
        meta = ce["data"]["metadata"]
        if ce["type"].endswith("updated"):
            got[f"{meta['namespace']}/{meta['name']}"].append(str(meta["resourceVersion"]))
    assert len(ids) == len(records) == 2040, "missing or duplicated events"
    assert got == sent  # every change of every object, in order
