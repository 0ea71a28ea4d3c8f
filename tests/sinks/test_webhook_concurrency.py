"""The webhook's concurrency against a real HTTP server with random per-request latencies: requests for
different objects overlap, one object's events are never in two requests at once nor reordered, and
an event is acknowledged only after the server answered 2xx for it; after an outage (the breaker
open) the backlog drains concurrently, and in batch mode an object's waiting events go together in
one batch, in order (a *run*), instead of one round trip per change."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.contract import DeliveryOutcome, EventType, SinkConfigError
from sinks.webhook import WebhookSink
from tests.sinks import Acks, event, obj


class Receiver:
    """The answers of a webhook (the kit's receiver): each request after a random latency (seeded),
    refusing a share of them with 503 and, while ``storming``, all of them (the test ends the storm:
    an event, not a time a loaded machine could miss). Records what it accepted and checks, per
    object, that no two requests carrying it overlap."""

    def __init__(self, *, seed: int, latency: tuple[float, float], refuse: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.latency = latency
        self.refuse = refuse
        self.storming = False
        self.storm_ended_at = 0.0
        self.refused = 0
        """Requests answered 503."""
        self.refusal = asyncio.Event()
        """Set at each refusal."""
        self.concurrency_at_accept: list[int] = []
        """Requests in flight (this one included) at each request accepted."""
        self.url = ""
        self.in_flight: dict[str, int] = {}
        self.overlaps: list[str] = []
        """Objects a request carried while another request carrying them was in flight."""
        self.requests = 0
        self.concurrent = 0
        self.max_concurrent = 0
        self.max_concurrent_after_storm = 0
        self.accepted: dict[str, list[int]] = {}
        """Per object (subject): the resourceVersions accepted, in the order they were accepted."""
        self.accepted_set: set[tuple[str, int]] = set()
        self.accepted_requests: list[tuple[float, list[dict[str, Any]]]] = []
        self.body_sizes: list[int] = []

    async def respond(self, request: ReceivedRequest) -> Reply:
        self.body_sizes.append(len(request.body))
        doc = orjson.loads(request.body)
        events = doc if isinstance(doc, list) else [doc]
        subjects = {ce["subject"] for ce in events}
        self.requests += 1
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        if not self.storming:
            self.max_concurrent_after_storm = max(self.max_concurrent_after_storm, self.concurrent)
        for subject in subjects:
            if self.in_flight.get(subject, 0):
                self.overlaps.append(subject)
            self.in_flight[subject] = self.in_flight.get(subject, 0) + 1
        try:
            await asyncio.sleep(self.rng.uniform(*self.latency))
            if self.storming or self.rng.random() < self.refuse:
                self.refused += 1
                self.refusal.set()
                return Reply(503)
            self.concurrency_at_accept.append(self.concurrent)
            for ce in events:
                rv = int(ce["resourceversion"])
                self.accepted.setdefault(ce["subject"], []).append(rv)
                self.accepted_set.add((ce["subject"], rv))
            self.accepted_requests.append((time.monotonic(), events))
            return Reply(204)
        finally:
            self.concurrent -= 1
            for subject in subjects:
                self.in_flight[subject] -= 1

    def end_storm(self) -> None:
        self.storming = False
        self.storm_ended_at = time.monotonic()


async def refused_at_least(receiver: Receiver, count: int) -> None:
    """Waits (on the receiver's answers, not a time) until ``count`` requests were refused."""
    while receiver.refused < count:
        receiver.refusal.clear()
        await receiver.refusal.wait()


@pytest.fixture
async def receiver(request: pytest.FixtureRequest) -> AsyncIterator[Receiver]:
    r = Receiver(**request.param)
    async with WebhookReceiver(respond=r.respond) as hook:
        r.url = hook.url
        yield r


class CheckedAcks(Acks):
    """Acks that check, when each comes, that the server had already accepted the event."""

    def __init__(self, receiver: Receiver) -> None:
        super().__init__()
        self.receiver = receiver
        self.early: list[str] = []

    def for_change(self, subject: str, rv: int):  # type: ignore[no-untyped-def]
        record = self.cb(f"{subject}@{rv}")

        def ack(outcome: DeliveryOutcome) -> None:
            if outcome is DeliveryOutcome.DELIVERED and (subject, rv) not in self.receiver.accepted_set:
                self.early.append(f"{subject}@{rv}")
            record(outcome)

        return ack


def _check_order(receiver: Receiver, acks: CheckedAcks, objects: int, changes: int) -> None:
    assert not receiver.overlaps, f"two requests for one object in flight: {receiver.overlaps[:5]}"
    assert not acks.early, f"acknowledged before the server's 2xx: {acks.early[:5]}"
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == objects * changes
    assert len(receiver.accepted) == objects
    for subject, rvs in receiver.accepted.items():
        # Each change once (the server accepts a request whole or not at all), in the order made.
        assert rvs == sorted(rvs), (subject, rvs)
        assert len(rvs) == len(set(rvs)) == changes, (subject, rvs)
    # Acks per object in the order of its changes.
    by_subject: dict[str, list[int]] = {}
    for label in acks.of(DeliveryOutcome.DELIVERED):
        subject, rv = label.rsplit("@", 1)
        by_subject.setdefault(subject, []).append(int(rv))
    assert all(rvs == sorted(rvs) for rvs in by_subject.values())


@pytest.mark.parametrize(
    ("receiver", "batch"),
    [({"seed": 11, "latency": (0.0, 0.02), "refuse": 0.1}, 1),
     ({"seed": 12, "latency": (0.0, 0.02), "refuse": 0.1}, 50)],
    ids=["one-per-request", "batches"], indirect=["receiver"],
)
async def test_objects_overlap_but_one_objects_changes_never_do(receiver: Receiver, batch: int) -> None:
    objects, changes = 24, 25
    sink = WebhookSink.from_options("hook", {
        "url": receiver.url, "batch": {"max_events": batch},
        "retry": {"initial": 0.01, "max": 0.05}, "breaker": {"failures": 1000},
    })
    await sink.start()
    acks = CheckedAcks(receiver)
    try:
        rv = 0
        for _ in range(changes):  # every object changes in turn: each lane fills while others send
            for i in range(objects):
                rv += 1
                o = obj(f"pod-{i}", uid=f"u-{i}", rv=str(rv))
                await sink.deliver(event(EventType.UPDATED, o), acks.for_change(f"default/pod-{i}", rv))
            await asyncio.sleep(0.002)
        assert await sink.flush(60), sink.stats.as_dict()
        _check_order(receiver, acks, objects, changes)
        assert sink.stats.retries > 0  # some requests were refused and sent again
        if batch == 1:
            assert receiver.max_concurrent >= 4, receiver.max_concurrent  # objects sent concurrently
        else:
            # An object's waiting changes went together (in order) rather than one per round trip.
            runs = [sum(1 for ce in events if ce["subject"] == "default/pod-0")
                    for _, events in receiver.accepted_requests]
            assert max(runs) > 1, runs
            assert len(receiver.accepted_requests) < changes * 2
    finally:
        await sink.close()


@pytest.mark.parametrize(
    ("receiver", "batch"),
    [({"seed": 21, "latency": (0.005, 0.02)}, 1), ({"seed": 22, "latency": (0.005, 0.02)}, 100)],
    ids=["one-per-request", "batches"], indirect=["receiver"],
)
async def test_the_backlog_after_the_breaker_closes_drains_concurrently(receiver: Receiver,
                                                                       batch: int) -> None:
    """503s while 10 objects change 40 times each: the breaker opens, the changes wait; when the
    storm ends and it closes they go at once: one request per object at a time, all objects
    together, or in batch mode a few batches each holding whole runs of an object's changes (not 40
    rounds of one change per object)."""
    objects, changes = 10, 40
    sink = WebhookSink.from_options("hook", {"url": receiver.url, "batch": {"max_events": batch}})
    await sink.start()
    acks = CheckedAcks(receiver)
    receiver.storming = True
    try:
        rv = 0
        for _ in range(changes):
            for i in range(objects):
                rv += 1
                o = obj(f"pod-{i}", uid=f"u-{i}", rv=str(rv))
                await sink.deliver(event(EventType.UPDATED, o), acks.for_change(f"default/pod-{i}", rv))
            await asyncio.sleep(0.01)
        # every change made; the storm lasts until enough refusals in a row opened the breaker
        await refused_at_least(receiver, sink.options.breaker.failures)
        receiver.end_storm()
        assert await sink.flush(30), sink.stats.as_dict()
        _check_order(receiver, acks, objects, changes)
        first = min(at for at, _ in receiver.accepted_requests)
        assert first >= receiver.storm_ended_at
        if batch == 1:
            assert receiver.max_concurrent_after_storm >= objects // 2, receiver.max_concurrent_after_storm
            # The objects went in parallel all along, not in one burst then one after the other:
            # most requests were accepted with half the objects' requests or more in flight.
            at_accept = sorted(receiver.concurrency_at_accept)
            assert at_accept[len(at_accept) // 2] >= objects // 2, at_accept
        else:
            # 400 changes, 100 to a batch: a few requests (40 rounds of one change per object before),
            # and the first of them went together.
            assert len(receiver.accepted_requests) <= 8, [len(e) for _, e in receiver.accepted_requests]
            assert receiver.max_concurrent_after_storm >= 2, receiver.max_concurrent_after_storm
    finally:
        await sink.close()


@pytest.mark.parametrize("receiver", [{"seed": 31, "latency": (0.0, 0.01)}], indirect=True)
async def test_a_run_never_makes_a_batch_larger_than_max_bytes(receiver: Receiver) -> None:
    """Runs are never split across requests, so they are cut to fit ``batch.max_bytes``: a backlog
    of 1.7 KB events with ``max_bytes: 4000`` goes two events to a request at most."""
    objects, changes, max_bytes = 4, 15, 4000
    sink = WebhookSink.from_options("hook", {"url": receiver.url,
                                             "batch": {"max_events": 50, "max_bytes": max_bytes}})
    await sink.start()
    acks = CheckedAcks(receiver)
    receiver.storming = True
    try:
        rv = 0
        for _ in range(changes):
            for i in range(objects):
                rv += 1
                o = obj(f"pod-{i}", uid=f"u-{i}", rv=str(rv), spec={"padding": "x" * 1000})
                await sink.deliver(event(EventType.UPDATED, o), acks.for_change(f"default/pod-{i}", rv))
        await refused_at_least(receiver, 1)  # the backlog built behind a refusal
        receiver.end_storm()
        assert await sink.flush(30), sink.stats.as_dict()
        _check_order(receiver, acks, objects, changes)
        sizes = [len(events) for _, events in receiver.accepted_requests]
        assert max(sizes) == 2, sizes  # the runs were cut to fit, but used
        assert max(receiver.body_sizes) <= max_bytes + 3, max(receiver.body_sizes)  # "[", ",", "]"
    finally:
        await sink.close()


def test_knative_mode_sends_one_event_per_request() -> None:
    with pytest.raises(SinkConfigError, match=r"compat 'knative' sends one event per request"):
        WebhookSink.from_options("hook", {"url": "http://h/", "compat": "knative",
                                          "batch": {"max_events": 10}})
    sink = WebhookSink.from_options("hook", {"url": "http://h/", "compat": "knative"})
    assert sink.options.batch.max_events == 1
