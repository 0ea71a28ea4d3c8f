"""File and stdout sinks: JSON lines, acks, rotation, fsync on flush, dead letters, config errors."""

from __future__ import annotations

import io
import os
from pathlib import Path

import orjson
import pytest

from sinks.contract import DeliveryOutcome, EventType, SinkConfigError
from sinks.file import FileSink, FileSinkOptions, StdoutSink, StdoutSinkOptions
from sinks.payload import apply_merge_patch
from tests.sinks import Acks, event, obj


async def test_file_sink_writes_one_cloudevent_per_line(tmp_path: Path) -> None:
    path = tmp_path / "out" / "events.jsonl"
    sink = FileSink.from_options("f", {"path": str(path), "payload": "merge_patch"})
    await sink.start()
    acks = Acks()
    v1 = obj("a", rv="1", spec={"replicas": 1, "paused": True})
    v2 = obj("a", rv="2", spec={"replicas": 3})
    await sink.deliver(event(EventType.ADDED, v1), acks.cb("add"))
    await sink.deliver(event(EventType.UPDATED, v2, old=v1), acks.cb("upd"))
    await sink.deliver(event(EventType.DELETED, v2), acks.cb("del"))
    assert await sink.flush(5)
    assert acks.outcomes == [
        ("add", DeliveryOutcome.DELIVERED),
        ("upd", DeliveryOutcome.DELIVERED),
        ("del", DeliveryOutcome.DELIVERED),
    ]
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [ce["type"] for ce in lines] == [
        "io.kube-event-bridge.added",
        "io.kube-event-bridge.updated",
        "io.kube-event-bridge.deleted",
    ]
    assert lines[1]["datacontenttype"] == "application/merge-patch+json"
    assert lines[1]["data"] == {"metadata": {"resourceVersion": "2"}, "spec": {"replicas": 3, "paused": None}}
    assert apply_merge_patch(lines[0]["data"], lines[1]["data"]) == v2
    await sink.close()
    # Appends across restarts.
    again = FileSink.from_options("f", {"path": str(path)})
    await again.deliver(event(EventType.ADDED, obj("b")), acks.cb("b"))
    assert await again.flush(5)
    assert len(path.read_bytes().splitlines()) == 4
    await again.close()


async def test_rotation_by_size(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = FileSink(name="f", options=FileSinkOptions(path=str(path), rotate_bytes=1500, keep=2))
    acks = Acks()
    for i in range(20):
        await sink.deliver(event(EventType.ADDED, obj(f"p{i:02}", rv=str(i))), acks.cb(str(i)))
    assert await sink.flush(5)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 20
    files = sorted(p.name for p in tmp_path.iterdir())  # noqa: ASYNC240
    assert files == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    names = []
    for name in ("events.jsonl.2", "events.jsonl.1", "events.jsonl"):
        names += [orjson.loads(line)["name"] for line in (tmp_path / name).read_bytes().splitlines()]
    # Oldest rotated file was discarded; what remains is the newest events, in order.
    assert names == [f"p{i:02}" for i in range(20 - len(names), 20)]
    assert (tmp_path / "events.jsonl.1").stat().st_size >= 1500
    await sink.close()


async def test_unwritable_path_fails_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    sink = FileSink.from_options("f", {"path": str(tmp_path / "file" / "events.jsonl")})
    with pytest.raises(SinkConfigError, match=r"sink 'f' \(file\): cannot open"):
        await sink.start()
    await sink.close()


def test_file_sink_options_errors() -> None:
    with pytest.raises(SinkConfigError, match=r"content_mode: JSON-lines sinks write structured events only"):
        FileSink.from_options("f", {"path": "/tmp/x", "content_mode": "binary"})
    with pytest.raises(SinkConfigError, match=r"sink 'f' \(file\): rotate_bytes: Input should be greater"):
        FileSink.from_options("f", {"path": "/tmp/x", "rotate_bytes": -1})


async def test_stdout_sink_writes_lines_and_filters() -> None:
    stream = io.BytesIO()
    sink = StdoutSink(
        name="out",
        options=StdoutSinkOptions.model_validate({"routing": {"event_types": ["deleted"]}}),
        stream=stream,
    )
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    await sink.deliver(event(EventType.DELETED, obj("a"), final_state_unknown=True), acks.cb("a-del"))
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.FILTERED), ("a-del", DeliveryOutcome.DELIVERED)]
    (line,) = stream.getvalue().splitlines()
    ce = orjson.loads(line)
    assert ce["finalstateunknown"] == "true"
    assert ce["subject"] == "default/a"
    await sink.close()


async def test_each_ack_comes_after_its_line_is_in_the_file_in_order(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = FileSink.from_options("f", {"path": str(path), "max_in_flight": 16})
    await sink.start()
    seen_at_ack: list[int] = []
    expected: list[str] = []

    def ack_for(rv: str):  # type: ignore[no-untyped-def]
        def ack(outcome: DeliveryOutcome) -> None:
            assert outcome is DeliveryOutcome.DELIVERED
            versions = [orjson.loads(line)["resourceversion"] for line in path.read_bytes().splitlines()]
            seen_at_ack.append(versions.index(rv))  # the acked line is already readable

        return ack

    for n in range(100):
        rv = str(n + 1)
        expected.append(rv)
        o = obj(f"o{n % 7}", rv=rv)
        await sink.deliver(event(EventType.UPDATED, o, old=obj(f"o{n % 7}", rv="0", spec=n)), ack_for(rv))
    assert await sink.flush(5)
    assert len(seen_at_ack) == 100
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(lines) == 100
    for name in {f"o{n % 7}" for n in range(100)}:  # each object's events in delivery order
        mine = [int(ce["resourceversion"]) for ce in lines if ce["name"] == name]
        assert mine == sorted(mine)
    await sink.close()


async def test_fsync_always_acks_after_a_shared_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    synced: set[str] = set()  # resourceVersions in a file at the time it was fsynced
    fsyncs = 0
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        nonlocal fsyncs
        real_fsync(fd)
        fsyncs += 1
        written = Path(os.readlink(f"/proc/self/fd/{fd}")).read_bytes().splitlines()
        synced.update(orjson.loads(line)["resourceversion"] for line in written)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    sink = FileSink.from_options("f", {"path": str(path), "fsync": "always", "rotate_bytes": 40_000})
    await sink.start()
    acked: list[str] = []

    def ack_for(rv: str):  # type: ignore[no-untyped-def]
        def ack(outcome: DeliveryOutcome) -> None:
            assert outcome is DeliveryOutcome.DELIVERED
            assert rv in synced  # its line was on disk before the ack
            acked.append(rv)

        return ack

    for n in range(200):
        await sink.deliver(event(EventType.ADDED, obj(f"o{n}", rv=str(n + 1))), ack_for(str(n + 1)))
    assert await sink.flush(10)
    assert sorted(acked, key=int) == [str(n + 1) for n in range(200)]
    assert fsyncs < 100  # group commits, not one fsync per event
    files = [path.with_name(f"events.jsonl.{i}") for i in (3, 2, 1)] + [path]
    assert files[2].exists()  # rotated while fsyncs were pending
    lines = [line for f in files if f.exists() for line in f.read_bytes().splitlines()]
    rvs = [orjson.loads(line)["resourceversion"] for line in lines]
    assert rvs == [str(n + 1) for n in range(200)]
    await sink.close()


async def test_a_torn_last_line_left_by_a_crash_is_ended_before_new_lines(tmp_path: Path) -> None:
    # A crash mid-write leaves half a line (its event was never acknowledged, so it is sent again);
    # the next line written must not be glued to it, or that acknowledged event is unreadable.
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"specversion":"1.0","id":"a"}\n{"specversion":"1.0","id":"tor')
    sink = FileSink.from_options("f", {"path": str(path)})
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a", rv="1")), acks.cb("add"))
    assert await sink.flush(5)
    await sink.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3
    assert lines[1] == b'{"specversion":"1.0","id":"tor'
    assert orjson.loads(lines[2])["type"] == "io.kube-event-bridge.added"
