"""File and stdout sinks: JSON lines, acks, rotation, fsync on flush, dead letters, config errors."""

from __future__ import annotations

import io
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
