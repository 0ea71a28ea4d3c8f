"""The sink-level circuit breaker, against a real HTTP server that answers 503 and 429 for a while.

Without a breaker every event waits out its own exponential retry timer (up to ``retry.max``, 30 s),
so after the destination recovers the backlog trickles in for as long as the longest timer: seconds
to tens of seconds. With it, consecutive failures open the breaker, one probe at a time asks the
destination, and the first success sends everything that waited at once, in order."""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.clock import FakeClock
from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.base import BaseSink, OutgoingMessage
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, SinkTransientError
from sinks.options import SinkOptions
from sinks.transport import Transport
from sinks.webhook import WebhookOptions, WebhookSink, WebhookTransport
from tests.sinks import Acks, event, obj


class Storm:
    """The answers of a webhook (the kit's receiver) answering 503 (and 429 with Retry-After: 1,
    every third request) until ``ends``, then 204; it records when (on ``now``, by default the
    monotonic clock) each event was accepted."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.ends = float("inf")
        self.requests = 0
        self.failed_requests = 0
        self.accepted: list[tuple[float, dict[str, Any]]] = []
        self.refused_at: list[float] = []
        self.refused_subjects: collections.Counter[str] = collections.Counter()
        self.url = ""

    async def respond(self, request: ReceivedRequest) -> Reply:
        self.requests += 1
        now = self.now()
        if now >= self.ends and b'"subject":"default/bad' in request.body:
            return Reply(400, body="refused")
        if now < self.ends:
            self.failed_requests += 1
            self.refused_at.append(now)
            data = orjson.loads(request.body)
            self.refused_subjects.update(ce["subject"] for ce in (data if isinstance(data, list) else [data]))
            if self.requests % 3 == 0:
                return Reply(429, retry_after=1)
            return Reply(503)
        self.accepted.append((now, orjson.loads(request.body)))
        return Reply(204)


@pytest.fixture
async def storm() -> AsyncIterator[Storm]:
    s = Storm()
    async with WebhookReceiver(respond=s.respond) as receiver:
        s.url = receiver.url
        yield s


class CountingWebhookTransport(WebhookTransport):
    """The webhook's transport, counting its HTTP requests under way."""

    sending = 0

    async def _post(self, url: str, headers: Mapping[str, str], body: bytes, msg_id: str) -> None:
        self.sending += 1
        try:
            await super()._post(url, headers, body, msg_id)
        finally:
            self.sending -= 1


class CountingWebhookSink(WebhookSink):
    """The webhook sink, counting its HTTP requests under way: with them, a test on a fake clock
    knows when every message is either acknowledged or waiting on that clock."""

    def _make_transport(self) -> Transport:
        return CountingWebhookTransport(name=self.name, options=self.options, clock=self._clock,
                                        config_error=self._config_error)

    @property
    def sending(self) -> int:
        assert isinstance(self.transport, CountingWebhookTransport)
        return self.transport.sending


async def _settle(sink: CountingWebhookSink) -> None:
    """Returns once no request of the sink is under way (each woken retry has reached its send:
    a few loop turns, no I/O, so this needs no wall-clock allowance)."""
    while True:
        for _ in range(10):
            await asyncio.sleep(0)
        if not sink.sending:
            return
        await asyncio.sleep(0.001)


async def test_the_backlog_is_sent_at_once_after_a_storms_end_in_order() -> None:
    # The sink's time (retry and probe waits, Retry-After) and the storm's run on a fake clock
    # that moves only while no request is under way: what the sink waits is counted exactly, and
    # the machine's load (how long a real request takes) cannot add to it.
    clock = FakeClock()
    storm = Storm(now=clock.now)
    rate, objects, duration = 100, 40, 8.0
    async with WebhookReceiver(respond=storm.respond) as receiver:
        # The sink's default retry policy (0.2 s doubling up to 30 s): the one the bridge runs with.
        sink = CountingWebhookSink(name="hook", options=WebhookOptions.from_mapping(
            "hook", {"url": receiver.url}, kind="webhook"), clock=clock)
        await sink.start()
        acks = Acks()
        storm.ends = clock.now() + duration
        sent = 0
        try:
            # Changes arrive at `rate` per (fake) second during the whole storm, each object
            # updated in turn.
            while clock.now() < storm.ends:
                i = sent % objects
                o = obj(f"pod-{i}", uid=f"u-{i}", rv=str(sent + 1))
                await sink.deliver(event(EventType.UPDATED, o), acks.cb(str(sent)))
                sent += 1
                await _settle(sink)
                await clock.advance(1 / rate)
            # After the storm: time moves on in the same steps until everything is in.
            while len(acks.of(DeliveryOutcome.DELIVERED)) < sent:
                assert clock.now() < storm.ends + 60, "the backlog was not delivered within 60 s"
                await _settle(sink)
                await clock.advance(1 / rate)
            assert await sink.flush(60)
            assert len(acks.of(DeliveryOutcome.DELIVERED)) == sent
            last = max(at for at, _ in storm.accepted)
            catch_up = last - storm.ends
            # In order per object, each change exactly once.
            seen: dict[str, list[int]] = {}
            for _, ce in storm.accepted:
                seen.setdefault(ce["subject"], []).append(int(ce["resourceversion"]))
            assert sum(len(v) for v in seen.values()) == sent
            assert all(v == sorted(v) for v in seen.values())
            # One probe at a time while open: the failed requests are far fewer than the failures
            # each event's own timer would have made.
            assert storm.failed_requests < sent
            # Once open, one probe at a time, at most a second apart (Retry-After: 1 included).
            late = [t for t in storm.refused_at if t > storm.ends - 5]
            assert 3 <= len(late) <= 12, late
            # What is left after the storm is sending, not waiting: on the sink's clock the whole
            # backlog is in after at most one probe's wait (Retry-After: 1 at most, the probe
            # interval otherwise) and one pacing step; each event on its own timer would wait
            # tens of seconds (27.9 s measured, docs/performance.md).
            print(f"catch-up {catch_up:.2f} s (sink clock) after the storm")
            assert catch_up <= 1.0 + 2 / rate + 1e-6, catch_up
            assert sink.healthy()
        finally:
            await sink.close()


async def test_waiting_events_give_up_after_max_elapsed(storm: Storm, tmp_path: Path) -> None:
    """A destination that never recovers: the events waiting behind the open breaker still go to
    the dead letter once ``retry.max_elapsed`` has passed (checked after each failed probe)."""
    storm.ends = float("inf")
    dead = tmp_path / "dead.jsonl"
    sink = WebhookSink.from_options("hook", {"url": storm.url, "retry": {"max_elapsed": 1.5},
                                             "dead_letter": {"kind": "file", "target": str(dead)}})
    await sink.start()
    acks = Acks()
    try:
        for i in range(30):
            ev = event(EventType.UPDATED, obj(f"pod-{i}", uid=f"u-{i}", rv="1"))
            await sink.deliver(ev, acks.cb(str(i)))
        assert await sink.flush(15)
        assert sorted(acks.of(DeliveryOutcome.DEAD_LETTERED), key=int) == [str(i) for i in range(30)]
        assert len(dead.read_bytes().splitlines()) == 30
        assert not sink.healthy()
        # Each event's first attempt (sent together, before the breaker opened), then probes only.
        assert storm.failed_requests <= 30 + 8
    finally:
        await sink.close()


async def test_without_the_breaker_each_event_keeps_its_own_timer(storm: Storm) -> None:
    # The storm lasts until every event was refused three times (an open breaker would send only
    # its probe: the others would never be refused again); the deadline only stops a hang.
    sink = WebhookSink.from_options("hook", {"url": storm.url, "breaker": {"enabled": False},
                                             "retry": {"initial": 0.05, "max": 0.1}})
    await sink.start()
    acks = Acks()
    try:
        for i in range(20):
            ev = event(EventType.UPDATED, obj(f"pod-{i}", uid=f"u-{i}", rv="1"))
            await sink.deliver(ev, acks.cb(str(i)))
        deadline = time.monotonic() + 60
        while len(storm.refused_subjects) < 20 or min(storm.refused_subjects.values()) < 3:
            assert time.monotonic() < deadline, f"not every event retried alone: {storm.refused_subjects}"
            await asyncio.sleep(0.01)
        storm.ends = time.monotonic()
        assert await sink.flush(60)
        assert len(acks.of(DeliveryOutcome.DELIVERED)) == 20
        # Every event retried on its own timer: three refusals or more each.
        assert storm.failed_requests >= 3 * 20
    finally:
        await sink.close()


async def test_a_probe_refused_for_good_closes_the_breaker(storm: Storm) -> None:
    """A refusal (400) is an answer: the destination is back, the event alone is bad. The probe that
    gets it goes to the dead letter and the waiting events are sent; nothing waits for a probe that
    will never come."""
    sink = WebhookSink.from_options("hook", {"url": storm.url})
    await sink.start()
    acks = Acks()
    storm.ends = time.monotonic() + 1.5
    try:
        # Four failures retry on their own timers; the fifth opens the breaker and is the oldest
        # waiting event, hence the first probe: one the server will refuse.
        def pod(i: int) -> ChangeEvent:
            return event(EventType.UPDATED, obj(f"pod-{i}", uid=f"u-{i}", rv="1"))

        for i in range(4):
            await sink.deliver(pod(i), acks.cb(str(i)))
            await asyncio.sleep(0.02)
        await sink.deliver(event(EventType.UPDATED, obj("bad-0", uid="u-bad", rv="1")), acks.cb("bad"))
        await asyncio.sleep(0.02)
        for i in range(4, 10):
            await sink.deliver(pod(i), acks.cb(str(i)))
        assert await sink.flush(15), sink.stats.as_dict()
        assert acks.of(DeliveryOutcome.DROPPED) == ["bad"]
        assert sorted(acks.of(DeliveryOutcome.DELIVERED), key=int) == [str(i) for i in range(10)]
    finally:
        await sink.close()


class DownSink(BaseSink[SinkOptions]):
    """A destination that refuses every send (transient) until ``up``; records each attempt's time."""

    kind = "down"

    def __init__(self, clock: FakeClock) -> None:
        # The default retry and breaker options: the timing the bridge runs with.
        super().__init__(name="down", options=SinkOptions.from_mapping("down", {}), clock=clock,
                         rng=lambda: 0.5)
        self.up = False
        self.attempts: list[float] = []

    async def _send(self, msg: OutgoingMessage) -> None:
        self.attempts.append(self._clock.now())
        if not self.up:
            raise SinkTransientError("503")


async def test_an_open_breaker_probes_at_least_every_quarter_second_by_default() -> None:
    """Once open, the probes back off from ``retry.initial`` to ``breaker.probe_interval``, by
    default a quarter of a second: the destination's recovery is noticed within that (plus its
    Retry-After, honoured when it sends one), not a second later."""
    clock = FakeClock()
    sink = DownSink(clock)
    acks = Acks()
    try:
        for i in range(5):  # five failures in a row open the breaker
            await sink.deliver(event(EventType.UPDATED, obj(f"pod-{i}", rv="1")), acks.cb(str(i)))
        for _ in range(20):
            await asyncio.sleep(0)
        while clock.now() < 1_000.0 + 30:
            await clock.advance(0.05)
        probes = sink.attempts[5:]
        assert len(probes) > 20
        gaps = [b - a for a, b in itertools.pairwise(probes)]
        assert max(gaps) <= 0.25 + 1e-6, gaps
        sink.up = True
        await clock.advance(0.3)
        assert await sink.flush(5)
        assert sorted(acks.of(DeliveryOutcome.DELIVERED)) == [str(i) for i in range(5)]
    finally:
        await sink.close()
