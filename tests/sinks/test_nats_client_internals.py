"""The NATS sinks reach their speed through private parts of nats-py's client (its command buffer,
its PONG futures, its transport, its ``max_payload``) and encode ``HPUB`` themselves. A nats-py
release may change any of these without notice, so the sinks accept only the releases they were
tested with (``NATS_PY_TESTED``, the same range as ``pyproject.toml``) and this file checks, against
a real nats-server, every private part they use: it fails on an untested release, and on a tested
one whose internals no longer look the way the sinks expect."""

from __future__ import annotations

import asyncio
import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

import nats
import pytest

import sinks.nats_base
from sinks.nats import NatsSink
from sinks.nats_base import (
    CLIENT_INTERNALS,
    NATS_PY_TESTED,
    PUBLISH_INTERNALS,
    header_block,
    hpub,
    nats_py_tested,
    nats_py_version,
    write_pending,
)
from tests import brokers
from tests.brokers import NatsServer, subscribed

nats_server = brokers.nats_server
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_nats_py_is_a_tested_release() -> None:
    installed = importlib.metadata.version("nats-py")
    (lo_major, lo_minor), (up_major, up_minor) = NATS_PY_TESTED
    assert nats_py_tested(), (
        f"nats-py {installed} is not a release the NATS sinks were tested with "
        f"(>={lo_major}.{lo_minor},<{up_major}.{up_minor}): they use nats-py's private internals; "
        "see docs/sinks.md (nats-py releases) for what an upgrade needs")
    assert nats_py_version() == tuple(int(p) for p in installed.split(".")[:2])


def test_pyproject_accepts_exactly_the_tested_range() -> None:
    (lo_major, lo_minor), (up_major, up_minor) = NATS_PY_TESTED
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    nats_py = [d for d in dependencies if d.startswith("nats-py")]
    assert nats_py == [f"nats-py[nkeys]>={lo_major}.{lo_minor},<{up_major}.{up_minor}"]


async def test_the_private_fields_the_sinks_use_have_the_expected_shape(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url, pending_size=123_456)
    try:
        assert set(CLIENT_INTERNALS) | set(PUBLISH_INTERNALS) == {
            "_pongs", "_pending", "_pending_data_size", "_transport", "_max_pending_size", "_max_payload",
            "stats"}
        assert sinks.nats_base._HAS_CLIENT_INTERNALS
        assert sinks.nats_base._HAS_PUBLISH_INTERNALS
        assert isinstance(nc._pending, list)
        assert type(nc._pending_data_size) is int
        assert nc._max_pending_size == 123_456  # the ``pending_size`` option
        assert nc._max_payload == nc.max_payload == 1024 * 1024  # the server's INFO max_payload
        assert isinstance(nc._pongs, list)
        assert nc._pongs == []
        assert nc._transport is not None
        assert callable(nc._transport.write)
        assert callable(nc._transport.writelines)
        assert type(nc.stats["out_msgs"]) is int
        assert type(nc.stats["out_bytes"]) is int
    finally:
        await nc.close()


@pytest.mark.parametrize(("reply", "headers"), [
    ("", {"content-type": "application/cloudevents+json"}),
    ("_INBOX.abc.7", {"content-type": "application/json", "ce-id": "x\r\ny", " ce-source ": " /a "}),
])
async def test_nats_py_publish_buffers_what_the_sink_encodes(
    nats_server: NatsServer, reply: str, headers: dict[str, str]
) -> None:
    """nats-py's publish appends its command to ``_pending`` (and counts it in
    ``_pending_data_size``) for its flusher task: the sink appends the identical bytes itself."""
    nc = await nats.connect(nats_server.url)
    try:
        body = b'{"kind":"Pod"}'
        before = nc._pending_data_size
        sent_before = dict(nc.stats)
        await nc.publish("k8s.pods.ns.a", body, reply=reply, headers=headers)
        expected = hpub("k8s.pods.ns.a", reply, header_block(headers), body)
        assert nc._pending[-1] == expected
        assert nc._pending_data_size == before + len(expected)
        assert nc.stats["out_msgs"] == sent_before["out_msgs"] + 1
        assert nc.stats["out_bytes"] == sent_before["out_bytes"] + len(body)
    finally:
        await nc.close()


class _Recorded(asyncio.Future[bool]):
    """A PONG future that records how nats-py resolved it (the sink's ``_PongRound`` overrides
    ``set_result`` to settle its messages inside nats-py's read loop)."""

    def __init__(self, order: list[str], name: str) -> None:
        super().__init__()
        self.order, self.name = order, name

    def set_result(self, result: Any, /) -> None:
        self.order.append(self.name)
        super().set_result(result)


async def test_nats_py_resolves_pong_futures_in_ping_order_with_set_result(nats_server: NatsServer) -> None:
    """What pipelined confirmation relies on: PINGs written to ``_transport`` after the buffered
    publishes, a future per PING appended to ``_pongs``, each PONG resolving the oldest with
    ``set_result``; and a publish written by ``write_pending`` reaches a subscriber."""
    nc = await nats.connect(nats_server.url)
    sub = await nats.connect(nats_server.url)
    try:
        got = await subscribed(sub, "guard.>")
        order: list[str] = []
        futures = [_Recorded(order, f"pong{i}") for i in range(3)]
        for i, future in enumerate(futures):
            await nc.publish(f"guard.{i}", b"x")
            transport = write_pending(nc)
            assert nc._pending == []
            assert nc._pending_data_size == 0
            transport.write(b"PING\r\n")
            nc._pongs.append(future)
        await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert order == ["pong0", "pong1", "pong2"]
        assert nc._pongs == []
        received = [await got.next_msg(timeout=5) for _ in range(3)]
        assert [m.subject for m in received] == ["guard.0", "guard.1", "guard.2"]
    finally:
        await nc.close()
        await sub.close()


async def test_a_sink_started_with_an_untested_nats_py_says_so(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sink = NatsSink.from_options("nats", {"servers": [nats_server.url]})
    await sink.start()
    await sink.close()
    assert not [r for r in caplog.records if "outside the releases" in r.getMessage()]
    monkeypatch.setattr(sinks.nats_base, "NATS_PY_TESTED", ((2, 99), (3, 0)))
    sink = NatsSink.from_options("nats", {"servers": [nats_server.url]})
    await sink.start()
    await sink.close()
    major, minor = nats_py_version()
    warned = [r.getMessage() for r in caplog.records if "outside the releases" in r.getMessage()]
    assert warned == [f"nats-py {major}.{minor} is outside the releases this sink is tested with "
                      "(>=2.99,<3.0): it relies on the client's private internals (docs/sinks.md)"]
