"""The sink registry: entry-point kinds, run-time registrations, clear errors."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sinks.contract import Sink, SinkConfigError
from sinks.file import FileSink, StdoutSink
from sinks.registry import create_sink, known_kinds, register, unregister
from sinks.webhook import WebhookSink


@pytest.fixture
def custom_kind() -> Iterator[str]:
    def factory(name: str, options: Mapping[str, Any]) -> Sink:
        return StdoutSink.from_options(name, options)

    register("custom-test", factory)
    yield "custom-test"
    unregister("custom-test")


def test_builtin_kinds_come_from_entry_points(tmp_path: Path) -> None:
    assert {"file", "stdout", "webhook", "kafka", "nats", "jetstream"} <= set(known_kinds())
    f = create_sink("file", "audit", {"path": str(tmp_path / "x.jsonl")})
    assert isinstance(f, FileSink)
    assert f.name == "audit"
    assert isinstance(create_sink("webhook", "hook", {"url": "http://127.0.0.1:9/"}), WebhookSink)
    assert isinstance(create_sink("stdout", "out"), StdoutSink)


def test_unknown_kind_lists_known_kinds(custom_kind: str) -> None:
    with pytest.raises(SinkConfigError) as err:
        create_sink("kafak", "audit", {})
    message = str(err.value)
    assert message.startswith("unknown sink kind 'kafak' (known kinds: ")
    for kind in ("custom-test", "file", "kafka", "nats", "stdout", "webhook"):
        assert kind in message


def test_registered_kind_and_bad_options(custom_kind: str) -> None:
    sink = create_sink(custom_kind, "mine", {"content_mode": "structured"})
    assert isinstance(sink, StdoutSink)
    with pytest.raises(SinkConfigError, match=r"sink 'mine' \(stdout\): nope: unknown option"):
        create_sink(custom_kind, "mine", {"nope": 1})
    with pytest.raises(SinkConfigError, match=r"sink 'f' \(file\): path: Field required"):
        create_sink("file", "f", {})


def test_factory_returning_a_non_sink_is_rejected() -> None:
    register("broken-test", lambda name, options: object())  # type: ignore[arg-type,return-value]
    try:
        with pytest.raises(SinkConfigError, match="built object, which is not a Sink"):
            create_sink("broken-test", "x", {})
    finally:
        unregister("broken-test")
