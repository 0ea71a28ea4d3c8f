"""A third-party sink built and tested against the kit alone: this module imports nothing of the
project but ``sinks.contract`` and ``bridge.testing`` (checked below), as a plugin outside the
repository would. The sink posts each event as a structured CloudEvent over HTTP (standard library
only), keeps a bounded window of requests in flight, honours Retry-After and dead-letters what a
receiver refuses for good; the kit's receiver scripts the answers and the kit's contract check
drives it."""

from __future__ import annotations

import ast
import asyncio
import email.utils
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bridge.testing import (
    AckRecorder,
    ContractBreach,
    ReceivedRequest,
    Reply,
    WebhookReceiver,
    change_event,
    deliver_all,
    kube_object,
)
from sinks.contract import AckCallback, ChangeEvent, DeliveryOptions, DeliveryOutcome, EventType, Sink


class CloudEventPoster:
    """Posts one structured CloudEvent per event; at most ``window`` requests at once."""

    def __init__(self, name: str, url: str, *, window: int = 4, ack_twice: bool = False) -> None:
        self.name = name
        self.url = url
        self.delivery = DeliveryOptions(buffer_capacity=16)
        self.last_error = ""
        self._window = asyncio.Semaphore(window)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ack_twice = ack_twice  # a defect, for the contract check to find
        self._closed = False

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def start(self) -> None:
        pass

    async def deliver(self, event: ChangeEvent, ack: AckCallback) -> None:
        await self._window.acquire()  # back-pressure: the bridge waits while the window is full
        task = asyncio.create_task(self._send(event, ack), name=f"{self.name}-send")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, event: ChangeEvent, ack: AckCallback) -> None:
        body = json.dumps({"specversion": "1.0", "id": f"{event.uid}-{event.resource_version}",
                           "source": f"/clusters/{event.cluster}", "type": f"example.{event.type.value}",
                           "subject": event.subject, "data": dict(event.obj or {})}).encode()
        try:
            while True:
                status, retry_after = await asyncio.to_thread(self._post, body)
                if status < 300 or (400 <= status < 500 and status != 429):
                    break
                self.last_error = f"HTTP {status}"
                await asyncio.sleep(retry_after if retry_after is not None else 0.01)
            self.last_error = ""
            outcome = DeliveryOutcome.DELIVERED if status < 300 else DeliveryOutcome.DEAD_LETTERED
            ack(outcome)
            if self._ack_twice:
                ack(outcome)
        finally:
            self._window.release()

    def _post(self, body: bytes) -> tuple[int, float | None]:
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/cloudevents+json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, None
        except urllib.error.HTTPError as err:
            return err.code, _seconds(err.headers.get("Retry-After"))

    async def flush(self, timeout: float) -> bool:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return not self._tasks

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def healthy(self) -> bool:
        return not self.last_error


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:  # an HTTP date
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())


def pods(n: int) -> list[ChangeEvent]:
    return [change_event(EventType.ADDED, kube_object(f"p{i}", rv=str(10 + i))) for i in range(n)]


def test_this_module_imports_only_the_stdlib_the_contract_and_the_kit() -> None:
    tree = ast.parse(Path(__file__).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    project = {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names}
    assert project == {"bridge.testing", "sinks.contract", "pytest"}


async def test_it_is_a_sink_and_delivers_every_event_once() -> None:
    async with WebhookReceiver() as hook:
        sink = CloudEventPoster("poster", hook.url)
        assert isinstance(sink, Sink)
        acks = await deliver_all(sink, pods(10))
        assert sorted(acks.of(DeliveryOutcome.DELIVERED), key=int) == [str(i) for i in range(10)]
        assert (hook.request_count, hook.event_count) == (10, 10)
        assert sorted(e["subject"] for e in hook.events) == sorted(f"default/p{i}" for i in range(10))
        assert {r.headers["Content-Type"] for r in hook.requests} == {"application/cloudevents+json"}


async def test_retry_after_is_honoured_and_a_refusal_for_good_is_dead_lettered() -> None:
    async def respond(request: ReceivedRequest) -> Reply | None:
        return Reply(422, body="no") if b"default/bad" in request.body else None

    async with WebhookReceiver(respond=respond) as hook:
        hook.script(Reply(429, retry_after=0.3), Reply(503, retry_after=0))
        sink = CloudEventPoster("poster", hook.url, window=1)
        events = [change_event(EventType.ADDED, kube_object("good")), change_event(
            EventType.ADDED, kube_object("bad"))]
        acks = await deliver_all(sink, events, labels=["good", "bad"])
        assert acks.outcomes == [("good", DeliveryOutcome.DELIVERED), ("bad", DeliveryOutcome.DEAD_LETTERED)]
        assert [r.status for r in hook.requests] == [429, 503, 204, 422]
        first, second = hook.requests[:2]
        assert second.at - first.at >= 0.29  # waited for Retry-After, not its own short pause
        assert [e["subject"] for e in hook.events] == ["default/good"]


async def test_requests_overlap_up_to_the_window_under_latency() -> None:
    async with WebhookReceiver(reply=Reply(204, delay=0.05)) as hook:
        sink = CloudEventPoster("poster", hook.url, window=3)
        acks = AckRecorder()
        await sink.start()
        for i, event in enumerate(pods(9)):
            await sink.deliver(event, acks.callback(str(i)))
        assert await sink.flush(10)
        await sink.close()
        assert len(acks.of(DeliveryOutcome.DELIVERED)) == 9
        assert 2 <= hook.max_in_flight <= 3
        assert hook.event_count == 9


async def test_the_kits_contract_check_catches_a_second_acknowledgement() -> None:
    async with WebhookReceiver() as hook:
        with pytest.raises(ContractBreach, match=r"acknowledged more than once: \['0'\]"):
            await deliver_all(CloudEventPoster("poster", hook.url, ack_twice=True), pods(1))
