"""The per-sink spill: an append-only, bounded segment log of notifications (bridge/delivery/spill.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.clock import FakeClock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    Gap,
    Notification,
    NotificationKind,
    ObjectKey,
    UnconfirmedGone,
)
from bridge.delivery.pipeline import BridgePipeline
from bridge.delivery.spill import SegmentSpill, decode_notification, encode_notification
from bridge.rawobject import Change, RawObject
from bridge.testing.fake_source import FakeControllerSource
from tests.checkpoint.helpers import WATCHED, RecordingSink, cm, fake_builder, until


def pod(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": rv, "uid": f"u-{name}"},
            **extra}


def upd(i: int) -> Notification:
    return Notification(kind=NotificationKind.UPDATE, obj=pod(f"p{i % 7}", str(i + 1), data="x" * 50),
                        old=pod(f"p{i % 7}", str(i)), seq=i, key=ObjectKey(f"ns/p{i % 7}"))


def norm(n: Notification) -> tuple[Any, ...]:
    """Every field, objects as plain dicts (a RawObject and its dict compare alike)."""
    def plain(o: Any) -> Any:
        if isinstance(o, DeletedFinalStateUnknown):
            return ("tombstone", o.key, dict(o.obj))
        return None if o is None else dict(o)
    return (n.kind, plain(n.obj), plain(n.old), n.is_in_initial_list, n.is_resync, n.seq, n.key,
            None if n.snapshot is None else [dict(o) for o in n.snapshot], n.resource_version, n.gap)


def test_every_kind_of_notification_round_trips() -> None:
    raw = RawObject.from_dict(pod("r", "9"))
    cases = [
        upd(3),
        Notification(kind=NotificationKind.ADD, obj=raw, is_in_initial_list=True, seq=1,
                     key=ObjectKey("ns/r")),
        Notification(kind=NotificationKind.DELETE, seq=2, key=ObjectKey("ns/t"),
                     obj=DeletedFinalStateUnknown(key=ObjectKey("ns/t"), obj=pod("t", "4"))),
        Notification(kind=NotificationKind.SNAPSHOT, obj={}, snapshot=[pod("a", "1"), raw], seq=5,
                     resource_version="77"),
        Notification(kind=NotificationKind.GAP, obj={}, seq=6,
                     gap=Gap(id="g1", from_resource_version="3", to_resource_version="9", end=True)),
        Notification(kind=NotificationKind.UPDATE, obj=pod("a", "2"), old=pod("a", "2"), is_resync=True,
                     seq=7, key=ObjectKey("ns/a")),
    ]
    for n in cases:
        assert norm(decode_notification(encode_notification(n))) == norm(n)
    assert type(decode_notification(encode_notification(cases[1])).obj) is RawObject
    tomb = decode_notification(encode_notification(cases[2])).obj
    assert isinstance(tomb, DeletedFinalStateUnknown)
    assert tomb.obj == pod("t", "4")
    snap = decode_notification(encode_notification(cases[3]))
    assert [dict(o) for o in snap.snapshot or ()] == [pod("a", "1"), pod("r", "9")]
    # A journal-only object a relist found gone stays one (the key it names may live on).
    gone = Notification(kind=NotificationKind.DELETE, seq=8, key=ObjectKey("ns/u"),
                        obj=UnconfirmedGone(key=ObjectKey("ns/u"), obj=pod("u", "5")))
    back = decode_notification(encode_notification(gone))
    assert type(back.obj) is UnconfirmedGone
    assert norm(back) == norm(gone)
    assert type(tomb) is DeletedFinalStateUnknown


_text = st.text(st.characters(codec="utf-8"), max_size=8)
_changes = st.none() | st.builds(Change, _text, _text, _text,
                                 st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ")))


@st.composite
def objects(draw: st.DrawFn) -> Any:
    """A plain object, or a RawObject with or without managedFields, its newest entry read before
    they were cut (``change``) as the compact cache does."""
    obj = pod(draw(_text) or "p", str(draw(st.integers(0, 10**9))),
              data=draw(st.dictionaries(_text, _text, max_size=3)))
    form = draw(st.sampled_from(["dict", "raw", "cut"]))
    if form == "dict":
        return obj
    if form == "raw":
        obj["metadata"]["managedFields"] = [{"manager": draw(_text), "operation": "Update",
                                             "time": "2024-05-01T12:00:00Z"}]
        return RawObject(orjson.dumps(obj))
    return RawObject(orjson.dumps(obj), change=draw(_changes))


@st.composite
def notifications(draw: st.DrawFn) -> Notification:
    kind = draw(st.sampled_from(NotificationKind))
    obj: Any = draw(objects())
    if draw(st.booleans()):
        tomb = draw(st.sampled_from([DeletedFinalStateUnknown, UnconfirmedGone]))
        obj = tomb(key=ObjectKey(draw(_text)), obj=obj)
    elif draw(st.booleans()):
        obj = {}
    gap = draw(st.none() | st.builds(Gap, _text, _text, _text, st.booleans()))
    return Notification(
        kind=kind, obj=obj, old=draw(st.none() | objects()), is_in_initial_list=draw(st.booleans()),
        is_resync=draw(st.booleans()), seq=draw(st.integers(-1, 2**62)), key=ObjectKey(draw(_text)),
        snapshot=draw(st.none() | st.lists(objects(), max_size=3)), resource_version=draw(_text), gap=gap,
        time=draw(st.floats(min_value=0, max_value=4e9, allow_nan=False)))


def envelope_view(value: Any) -> Any:
    """What a sink's envelope can read of a field: an object's content, type and ``change``."""
    if isinstance(value, DeletedFinalStateUnknown):
        return (type(value), value.key, envelope_view(value.obj))
    if type(value) is RawObject:
        return (RawObject, value.to_dict(), value.change)
    if isinstance(value, list):
        return [envelope_view(v) for v in value]
    if isinstance(value, dict):
        return (dict, value)
    return value


@settings(max_examples=300, deadline=None)
@given(notifications())
def test_a_spilled_notification_keeps_every_field(n: Notification) -> None:
    back = decode_notification(encode_notification(n))
    for f in dataclasses.fields(Notification):
        assert envelope_view(getattr(back, f.name)) == envelope_view(getattr(n, f.name)), f.name


@settings(max_examples=100, deadline=None)
@given(notifications())
def test_an_object_changed_by_the_spill_form_keeps_its_change(n: Notification) -> None:
    """A sink that redacts spills a decoded copy (sinks/redaction.py): the attribution read before
    managedFields were cut must survive that too."""
    def copied(obj: Any) -> Any:
        return obj.copy_dict() if type(obj) is RawObject else dict(obj)

    def change(value: Any) -> Any:
        value = value.obj if isinstance(value, DeletedFinalStateUnknown) else value
        return value.change if type(value) is RawObject else None

    back = decode_notification(encode_notification(n, copied))
    assert change(back.obj) == change(n.obj)
    assert change(back.old) == change(n.old)
    assert [change(o) for o in back.snapshot or ()] == [change(o) for o in n.snapshot or ()]
    assert back.time == n.time


def test_reads_back_in_order_across_segments_and_deletes_what_was_read(tmp_path: Path) -> None:
    spill = SegmentSpill(tmp_path / "s", limit_bytes=1 << 20, segment_bytes=2000, sync_bytes=4000)
    for i in range(200):
        assert spill.append(upd(i))
    assert len(spill) == 200
    spill.sync()
    segments = sorted((tmp_path / "s").iterdir())
    assert len(segments) > 5
    assert spill.size_bytes == sum(p.stat().st_size for p in segments)
    assert spill.syncs > 0  # fsynced in groups, not per record
    got = spill.read(50)
    assert [n.seq for n in got] == list(range(50))
    assert len(list((tmp_path / "s").iterdir())) < len(segments)  # read segments are gone
    for i in range(200, 230):  # appends while reading keep the order
        assert spill.append(upd(i))
    rest: list[Notification] = []
    while batch := spill.read(17):
        rest.extend(batch)
    assert [n.seq for n in rest] == list(range(50, 230))
    assert rest[-1] == upd(229)
    assert (len(spill), spill.size_bytes) == (0, 0)
    assert list((tmp_path / "s").iterdir()) == []


def test_the_byte_limit_refuses_appends_and_reading_frees_room(tmp_path: Path) -> None:
    spill = SegmentSpill(tmp_path / "s", limit_bytes=8000)
    accepted = 0
    while spill.append(upd(accepted)):
        accepted += 1
    assert 0 < accepted < 100
    assert spill.size_bytes <= 8000
    assert spill.refused == 1
    assert not spill.append(upd(999))
    spill.read(accepted)  # everything read: the files go, room again
    assert spill.append(upd(1000))
    assert [n.seq for n in spill.read(10)] == [1000]


def test_a_torn_record_ends_the_readable_part_with_an_error(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    spill = SegmentSpill(tmp_path / "s", limit_bytes=1 << 20, segment_bytes=1 << 20)
    for i in range(10):
        spill.append(upd(i))
    spill.sync()
    (segment,) = (tmp_path / "s").iterdir()
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    got = spill.read(100)
    assert 0 < len(got) < 10
    assert [n.seq for n in got] == list(range(len(got)))
    assert spill.corrupt == 10 - len(got)
    assert len(spill) == 0
    assert "damaged record" in caplog.text


def test_a_new_spill_starts_empty_and_clear_removes_its_files(tmp_path: Path) -> None:
    d = tmp_path / "s"
    first = SegmentSpill(d, limit_bytes=1 << 20)
    first.append(upd(1))
    first.close()
    assert list(d.iterdir())
    second = SegmentSpill(d, limit_bytes=1 << 20)
    assert len(second) == 0
    assert list(d.iterdir()) == []
    second.append(upd(2))
    second.clear()
    assert not d.exists()
    with pytest.raises(ValueError, match="limit_bytes"):
        SegmentSpill(d, limit_bytes=0)


async def test_an_unusable_spill_directory_is_reported_and_the_sink_runs_without_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    source = FakeControllerSource()
    source.add(cm("a"))
    clock = FakeClock()
    sink = RecordingSink("s")
    sink.overflow_policy = "spill"
    p = BridgePipeline(resources=[WATCHED], sinks=[sink], checkpoint_store=None,
                       build_informer=fake_builder(source, clock), clock=clock, spill_directory=blocker)
    await p.start()
    try:
        await until(lambda: len(sink.events) == 1, what="delivery without a spill")
        assert "its spill directory" in caplog.text
        assert p.sink_backlog("s").spill_bytes == 0
    finally:
        await p.shutdown(5)
