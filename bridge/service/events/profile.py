"""The events profile: Kubernetes Events as first-class CloudEvents.

A resource entry with ``profile: events`` (core ``events``, ``events.events.k8s.io``, or both) has
each of its changes annotated before any sink encodes it:

- **attributes** a consumer routes on without parsing ``data`` (CloudEvents extension attributes,
  lowercase alphanumerics as the specification requires): ``reason``, ``eventtype`` (``Normal`` /
  ``Warning``: the envelope's own ``type`` is the change type), ``involvedkind``,
  ``involvednamespace``, ``involvedname``, ``involveduid``, ``involvedapiversion``, ``count`` and,
  when the Event has a series, ``seriescount``; ``reporter`` (the reporting controller);
- **enrichment** (:mod:`bridge.service.events.enrichment`): ``enrichment`` (``ok``, ``gone``,
  ``unknown``, ``skipped``), ``involvedlabels`` and ``involvedannotations`` (JSON objects, when not
  empty), ``ownerkind`` / ``ownername`` (the top controller) and ``ownerchain``
  (``ReplicaSet/web-5d8f,Deployment/web``, from the direct owner up);
- the **Events counter** (:mod:`bridge.service.events.metrics`) counts each new Event and each
  repetition once, however many sinks receive it (in the first sink that receives the resource).

The pipeline hands each sink its own :class:`~sinks.contract.ChangeEvent`, so the annotation of one
change (one Event uid at one resourceVersion) is computed once and remembered for the next sinks
(the last ``_REMEMBERED`` changes): sinks at the same pace carry the same attributes for one change.

**Coalescing** (``events.coalesce_window`` > 0) is per sink, in :class:`EventsStage`, the stage the
service puts in every sink's delivery chain (:mod:`bridge.delivery.chain`): an ``updated`` Event (a
repetition: ``count`` / ``series`` bumped) is held for the window; a newer update of the same Event
arriving meanwhile replaces it, and the replaced one is acknowledged as ``filtered`` (its content is
in the newer state, which is unacknowledged until sent). When the window ends, the held state is
handed on (to the rest of the chain, then the sink) with its own acknowledgement, so the checkpoint
cannot pass an update that is held: a crash while holding it re-reads it from the watch after the
restart (at-least-once, as everywhere in the bridge). Nothing is dropped by age: the last state of
every Event is always sent. New Events (``added``), deletions and snapshot events are never held;
one arriving for an Event with a held update first sends that update, so one Event's changes stay in
order; a snapshot or gap marker first sends everything held.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Sequence

import orjson

from bridge.clock import Clock, RealClock
from bridge.delivery.chain import HandOn
from bridge.service.events.enrichment import Enricher, Enrichment
from bridge.service.events.metrics import EventCounter
from sinks.contract import AckCallback, ChangeEvent, DeliveryOutcome, EventType, ResourceRef
from sinks.eventfacts import EventFacts, event_facts, is_event_resource

__all__ = ["EventsProfile", "EventsStage", "event_extensions"]

log = logging.getLogger(__name__)

_REMEMBERED = 4096
"""Annotations kept for the next sinks: one change reaches every sink within a few thousand
changes unless a sink is far behind (then its annotation is computed again, from the caches)."""


def event_extensions(facts: EventFacts, enrichment: Enrichment | None) -> dict[str, str]:
    """The extension attributes of one Event change (see the module docstring)."""
    inv = facts.involved
    ext = {"reason": facts.reason, "eventtype": facts.type, "involvedkind": inv.kind,
           "involvednamespace": inv.namespace, "involvedname": inv.name, "involveduid": inv.uid,
           "involvedapiversion": inv.api_version, "count": str(facts.count)}
    if facts.series_count is not None:
        ext["seriescount"] = str(facts.series_count)
    if facts.reporter:
        ext["reporter"] = facts.reporter
    if enrichment is not None:
        ext["enrichment"] = enrichment.status
        if enrichment.labels:
            ext["involvedlabels"] = enrichment.labels_json or orjson.dumps(
                enrichment.labels, option=orjson.OPT_SORT_KEYS).decode()
        if enrichment.annotations:
            ext["involvedannotations"] = enrichment.annotations_json or orjson.dumps(
                enrichment.annotations, option=orjson.OPT_SORT_KEYS).decode()
        if enrichment.owners:
            top = enrichment.owners[-1]
            ext["ownerkind"] = top.kind
            ext["ownername"] = top.name
            ext["ownerchain"] = ",".join(f"{o.kind}/{o.name}" for o in enrichment.owners)
    return ext


class EventsProfile:
    """Annotates the changes of the profiled resources; one per pipeline, shared by every sink."""

    def __init__(self, *, profiled: Callable[[ResourceRef], bool], enricher: Enricher | None,
                 counter: EventCounter | None) -> None:
        self._profiled = profiled
        self.enricher = enricher
        self._counter = counter
        self._done: collections.OrderedDict[tuple[str, str, str], dict[str, str]] = collections.OrderedDict()
        self._running: dict[tuple[str, str, str], asyncio.Future[dict[str, str]]] = {}
        self._counting: dict[tuple[str, str], str] = {}
        """(group, resource) → the sink whose deliveries the counter counts."""
        self.annotated = 0
        """Changes annotated (each once, whatever the number of sinks)."""

    def profiles(self, ref: ResourceRef) -> bool:
        """Whether the changes of ``ref`` go through the profile."""
        return is_event_resource(ref.group, ref.resource) and self._profiled(ref)

    def profiled(self, event: ChangeEvent) -> bool:
        res = event.resource
        return event.obj is not None and is_event_resource(res.group, res.resource) and self._profiled(res)

    @staticmethod
    def _key(event: ChangeEvent) -> tuple[str, str, str]:
        deleted = "d" if event.type is EventType.DELETED else ""
        return (event.uid, event.resource_version, deleted)

    def _remember(self, key: tuple[str, str, str], ext: dict[str, str]) -> None:
        self._done[key] = ext
        if len(self._done) > _REMEMBERED:
            self._done.popitem(last=False)
        self.annotated += 1

    def count(self, event: ChangeEvent, sink: str) -> None:
        """Counts a new Event or a repetition once: in the first sink that receives the resource
        (every sink sees each change of a resource it is routed to)."""
        if self._counter is None or event.type not in (EventType.ADDED, EventType.UPDATED):
            return
        res = event.resource
        owner = self._counting.setdefault((res.group, res.resource), sink)
        if owner == sink and event.obj is not None:
            self._counter.count(event_facts(event.obj))

    def annotate_now(self, event: ChangeEvent) -> bool:
        """Annotates ``event`` if that needs no waiting; False when :meth:`annotate` must be awaited."""
        key = self._key(event)
        ext = self._done.get(key)
        if ext is None:
            if key in self._running:
                return False
            assert event.obj is not None
            facts = event_facts(event.obj)
            enrichment = None
            if self.enricher is not None:
                enrichment = self.enricher.lookup_now(facts.involved)
                if enrichment is None:
                    return False
            ext = event_extensions(facts, enrichment)
            self._remember(key, ext)
        event.extensions.update(ext)
        return True

    async def annotate(self, event: ChangeEvent) -> None:
        if self.annotate_now(event):
            return
        key = self._key(event)
        running = self._running.get(key)
        if running is None:
            running = asyncio.get_running_loop().create_future()
            self._running[key] = running
            try:
                assert event.obj is not None
                facts = event_facts(event.obj)
                enrichment = None
                if self.enricher is not None:
                    enrichment = await self.enricher.lookup(
                        facts.involved, event_rv=event.resource_version, wait=event.type is EventType.ADDED)
                ext = event_extensions(facts, enrichment)
                self._remember(key, ext)
                running.set_result(ext)
            except BaseException as e:
                running.set_exception(e)
                raise
            finally:
                del self._running[key]
        else:
            ext = await asyncio.shield(running)
        event.extensions.update(ext)

    async def close(self) -> None:
        if self.enricher is not None:
            await self.enricher.close()


class _Held:
    __slots__ = ("ack", "deadline", "event")

    def __init__(self, event: ChangeEvent, ack: AckCallback, deadline: float) -> None:
        self.event = event
        self.ack = ack
        self.deadline = deadline


class EventsStage:
    """The events profile in one sink's delivery chain: annotation, then coalescing."""

    name = "events"
    reads = ("obj (an Event's reason, type, involved object, count, series, reporter)", "type", "uid",
             "resource_version", "resource", "(the involved objects' metadata caches)")
    adds = ("extensions: reason, eventtype, involved*, count, seriescount, reporter, enrichment, "
            "involvedlabels, involvedannotations, ownerkind, ownername, ownerchain",
            "holds an updated Event for the coalescing window; a replaced one is acknowledged as filtered",
            "counts each new Event and repetition once (keb_kubernetes_events_total)")

    def __init__(self, *, sink: str, profile: EventsProfile, coalesce_window: float = 0.0,
                 max_pending: int = 100_000, clock: Clock | None = None) -> None:
        """``sink`` names the sink whose chain this is (the Events counter counts in one sink)."""
        self.sink = sink
        self._profile = profile
        self._window = coalesce_window
        self._max_pending = max_pending
        self._clock: Clock = clock or RealClock()
        self._held: collections.OrderedDict[str, _Held] = collections.OrderedDict()
        """Held updates by Event uid, oldest first (every hold lasts the same window)."""
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self.coalesced = 0
        """Updates replaced by a newer state of the same Event within the window."""
        self.held_sent = 0
        """Held updates handed on when their window ended (or earlier, see the module docs)."""

    @property
    def profile(self) -> EventsProfile:
        """The profile it applies (shared by every sink's stage)."""
        return self._profile

    @property
    def held(self) -> int:
        return len(self._held)

    async def start(self, hand_on: HandOn) -> None:
        if self._window > 0:
            self._timer = asyncio.create_task(self._run_timer(hand_on), name=f"events-coalesce-{self.sink}")

    async def process(self, events: Sequence[ChangeEvent], acks: Sequence[AckCallback],
                      hand_on: HandOn) -> None:
        out_events: list[ChangeEvent] = []
        out_acks: list[AckCallback] = []
        profile = self._profile
        async with self._lock:
            for event, ack in zip(events, acks, strict=True):
                if event.obj is None:
                    self._release_all(out_events, out_acks)  # markers are barriers
                elif profile.profiled(event):
                    if not profile.annotate_now(event):
                        await profile.annotate(event)
                    profile.count(event, self.sink)
                    if self._window > 0 and self._hold(event, ack, out_events, out_acks):
                        continue
                out_events.append(event)
                out_acks.append(ack)
            if out_events:
                await hand_on(out_events, out_acks)

    def _hold(self, event: ChangeEvent, ack: AckCallback, out_events: list[ChangeEvent],
              out_acks: list[AckCallback]) -> bool:
        """True when ``event`` is held (or replaced a held one); otherwise releases a held update
        of the same Event into the output first, so it precedes ``event``."""
        uid = event.uid
        held = self._held.get(uid)
        if event.type is not EventType.UPDATED:
            if held is not None:
                del self._held[uid]
                out_events.append(held.event)
                out_acks.append(held.ack)
                self.held_sent += 1
            return False
        if held is not None:
            held.ack(DeliveryOutcome.FILTERED)
            held.event, held.ack = event, ack
            self.coalesced += 1
            return True
        if len(self._held) >= self._max_pending:
            _, oldest = self._held.popitem(last=False)
            out_events.append(oldest.event)
            out_acks.append(oldest.ack)
            self.held_sent += 1
        was_empty = not self._held
        self._held[uid] = _Held(event, ack, self._clock.now() + self._window)
        if was_empty:
            self._wake.set()
        return True

    def _release_all(self, out_events: list[ChangeEvent], out_acks: list[AckCallback]) -> None:
        for held in self._held.values():
            out_events.append(held.event)
            out_acks.append(held.ack)
        self.held_sent += len(self._held)
        self._held.clear()

    async def _run_timer(self, hand_on: HandOn) -> None:
        while not self._closed:
            if not self._held:
                self._wake.clear()
                await self._wake.wait()
                continue
            first = next(iter(self._held.values()))
            delay = first.deadline - self._clock.now()
            if delay > 0:
                await self._clock.sleep(delay)
                continue
            async with self._lock:
                now = self._clock.now()
                out_events: list[ChangeEvent] = []
                out_acks: list[AckCallback] = []
                while self._held:
                    uid, held = next(iter(self._held.items()))
                    if held.deadline > now:
                        break
                    del self._held[uid]
                    out_events.append(held.event)
                    out_acks.append(held.ack)
                self.held_sent += len(out_events)
                try:
                    if out_events:
                        await hand_on(out_events, out_acks)
                except Exception:
                    # The sink refused (closed): the held events stay unacknowledged and are sent
                    # again after a restart; nothing more can be done here.
                    log.exception("events profile: handing held updates to sink %s failed", self.sink)
                    return

    async def flush(self, hand_on: HandOn) -> None:
        async with self._lock:
            out_events: list[ChangeEvent] = []
            out_acks: list[AckCallback] = []
            self._release_all(out_events, out_acks)
            if out_events:
                await hand_on(out_events, out_acks)

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._timer
            self._timer = None
        # Held updates stay unacknowledged: the checkpoint did not pass them, a restart re-reads them.
