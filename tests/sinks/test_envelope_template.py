"""The byte templates (:mod:`sinks.envelope_template`) build the reference builder's message, byte for
byte: a randomized differential test over objects (unicode, big integers, escapes, Go's ``\\u003c``,
nesting), identities that need escaping, event types, context attributes, payload modes, content
modes, header prefixes and sink options, seeded so that a failure replays. Templated structured
events are also read back with the official CloudEvents SDK, attribute for attribute.
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import orjson
import pytest
from cloudevents.core.formats.json import JSONFormat

from bridge.rawobject import Change, RawObject
from sinks.cloudevents import KAFKA_PREFIX, STRUCTURED_CONTENT_TYPE, decode_structured
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, GapInfo, ResourceRef, SnapshotInfo
from sinks.envelope_template import TemplatedBuilder, covers
from sinks.message import OutgoingMessage
from sinks.options import SinkOptions
from tests.sinks import DEPLOYMENTS, NODES, PODS, SECRETS, RecordingSink

WIDGETS = ResourceRef(group="exämple.io", version="v1beta1", resource="widgets", kind='Wid"get')
RESOURCES = (PODS, PODS, PODS, NODES, DEPLOYMENTS, SECRETS, WIDGETS)
TEXTS = ("web-0", "a", "ünïcödé", "中文", "emoji-😀", 'quo"te', "back\\slash", "line\nfeed", "nul\x00",
         "ctl\x1f", "del\x7f", "pct%20", "lt<gt>&amp", "ls\u2028ps\u2029", "sp ace", "", "/slash")
OPTIONS: tuple[dict[str, Any], ...] = (
    {}, {"content_mode": "binary"}, {"key": "namespace/name"},
    {"destination": "{cluster}.{namespace}.{name}"}, {"destination": "hooks/{labels[app]}"},
    {"destination": "fixed"}, {"payload": "object_and_old"},
    {"payload": "merge_patch"}, {"payload": "object_and_old", "content_mode": "binary"},
    {"redact": {"paths": ["spec.x"]}}, {"redact": {"managed_fields": "keep"}}, {"fields": ["metadata.name"]},
    {"compat": "knative"}, {"compat": "knative", "knative_mode": "reference"},
    {"compat": "knative", "content_mode": "binary", "knative_source": 'https://api.example/ä"%'},
    {"compat": "knative", "knative_mode": "reference", "content_mode": "binary"},
)
CASES = 3000
"""Events per run, over every option set and both header prefixes."""


class KafkaPrefixed(RecordingSink):
    header_prefix = KAFKA_PREFIX


def text(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(("web", "db", "x", "pod-7"))
    return "".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 3)))


def value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        return {text(rng): value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 3 and roll < 0.4:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rng.choice((
        text(rng), rng.randint(-(2**40), 2**40), 2**70 + rng.randint(0, 9), -(2**65), rng.random() * 1e20,
        1.5e-7, True, False, None,
    ))


def change(rng: random.Random) -> Change | None:
    if rng.random() < 0.3:
        return None
    manager = rng.choice(("kubectl", "kubelet", "bötchen/\u03c1", 'q"m', "", "sur\ud800rogate"))
    return Change(manager, rng.choice(("Update", "Apply", "")), rng.choice(("", "status", "scale")),
                  "2024-05-01T12:00:00Z")


def new_object(rng: random.Random, resource: ResourceRef) -> Any:
    meta: dict[str, Any] = {"name": text(rng), "uid": rng.choice((f"uid-{rng.randint(0, 9)}", "", text(rng))),
                            "resourceVersion": rng.choice((str(rng.randint(1, 10**6)), "", text(rng)))}
    if resource.namespaced and rng.random() < 0.9:
        meta["namespace"] = text(rng)
    if rng.random() < 0.5:
        meta["labels"] = {"app": text(rng)}
    if rng.random() < 0.05:
        meta["managedFields"] = [{"manager": "m", "operation": "Update", "time": "2024-05-01T12:00:00Z"}]
    doc = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta,
           "spec": value(rng), "status": value(rng)}
    roll = rng.random()
    if roll < 0.08:
        return doc  # a decoded dict: the reference's
    if roll < 0.25 and _small(doc):  # as Go writes it: <, > and & escaped
        raw = orjson.dumps(doc).replace(b"<", b"\\u003c").replace(b">", b"\\u003e")
        return RawObject(raw.replace(b"&", b"\\u0026"), change=change(rng))
    return RawObject.from_dict(doc, change=change(rng))


def _small(doc: Any) -> bool:
    try:
        orjson.dumps(doc)
    except TypeError:
        return False  # an integer beyond 64 bits: RawObject.from_dict writes it exactly
    return True


def extensions(rng: random.Random) -> dict[str, str]:
    if rng.random() < 0.6:
        return {}
    keys = ("Trace-Parent", "traceparent", "id", "name", "namespace", "manager", "data", "reason", "__",
            "Ünï", "involvedKind", "count")
    return {rng.choice(keys): text(rng) for _ in range(rng.randint(1, 3))}


def random_event(rng: random.Random) -> ChangeEvent:
    resource = rng.choice(RESOURCES)
    if rng.random() < 0.03:
        return ChangeEvent(type=EventType.SNAPSHOT_BEGIN, resource=resource, cluster="prod", obj=None,
                           time=1.7e9, snapshot=SnapshotInfo("s", "5"))
    etype = rng.choice((EventType.ADDED, EventType.UPDATED, EventType.UPDATED, EventType.DELETED,
                        EventType.SYNC))
    obj = new_object(rng, resource)
    old = new_object(rng, resource) if etype is EventType.UPDATED or rng.random() < 0.1 else None
    ext = extensions(rng)
    if etype is EventType.DELETED and rng.random() < 0.3:
        ext["leftselector"] = rng.choice(("true", "false"))
    snapshot = None
    if etype is EventType.SYNC or rng.random() < 0.05:
        shards = rng.choice((None, 3))
        snapshot = SnapshotInfo(text(rng), str(rng.randint(1, 99)), count=rng.choice((None, 4)),
                                shard=1 if shards else None, total_shards=shards)
    gap = GapInfo(text(rng), "10", rng.choice(("", "20"))) if rng.random() < 0.1 else None
    return ChangeEvent(
        type=etype, resource=resource, cluster=rng.choice(("prod", "prod", "clü\"ster")), obj=obj, old=old,
        time=rng.choice((1_714_564_800.0, 1_714_564_800.5, 1_700_000_000.123456, 1.7e9 + rng.random() * 1e6)),
        final_state_unknown=etype is EventType.DELETED and rng.random() < 0.3, snapshot=snapshot, gap=gap,
        extensions=ext,
    )


def wire(msg: OutgoingMessage) -> tuple[Any, ...]:
    """Everything of a message that is sent or decides where and in which order it goes."""
    return (msg.key, msg.destination, list(msg.headers.items()), msg.body, msg.event_id, msg.lane,
            msg.error, msg.quarantine, msg.header_prefix)


def ack(_outcome: DeliveryOutcome) -> None:
    pass


FMT = JSONFormat()


def templated_alone(sink: RecordingSink, event: ChangeEvent) -> tuple[OutgoingMessage, bool]:
    """The message of a fresh templated builder (no template kept yet) of ``sink``, and whether it
    handed the event to the reference."""
    envelope = sink._envelope
    used: list[ChangeEvent] = []

    def fallback(ev: ChangeEvent, cb: Any) -> OutgoingMessage:
        used.append(ev)
        return envelope.reference_build(ev, cb)

    fast = TemplatedBuilder(options=sink.options, header_prefix=sink.header_prefix,
                            leaves_raw=sink._redactor.leaves_raw,
                            static=sink._template.text if sink._template.static else None,
                            destination=envelope._identity_destination(), fallback=fallback)
    return fast.build(event, ack), bool(used)


@pytest.mark.parametrize("prefixed", [RecordingSink, KafkaPrefixed])
def test_templates_build_the_reference_message_byte_for_byte(prefixed: type[RecordingSink]) -> None:
    rng = random.Random(36)
    templated = fell_back = escaped = 0
    for n in range(CASES):
        opts = OPTIONS[n % len(OPTIONS)]
        sink = prefixed(name="t", options=SinkOptions.model_validate(opts))
        envelope = sink._envelope
        event = random_event(rng)
        reference = envelope.reference_build(event, ack)
        assert wire(envelope.build(event, ack)) == wire(reference), (n, opts, event)
        if not covers(sink.options, projected=bool(sink.options.fields)):
            fell_back += 1
            continue
        msg, used = templated_alone(sink, event)
        assert wire(msg) == wire(reference), (n, opts, event)
        if used:
            fell_back += 1
            continue
        templated += 1
        escaped += any(c in event.name + event.namespace for c in '"\\\n\x00\x1f%\x7f')
        ce = decode_structured(msg.body) if msg.headers["content-type"] == STRUCTURED_CONTENT_TYPE else {}
        if ce.get("subject"):  # the SDK refuses an empty subject (an object without a name)
            attrs = dict(FMT.read(None, msg.body).get_attributes())
            time = attrs.pop("time")
            assert time == datetime.fromisoformat(ce.pop("time")), (n, opts)
            ce.pop("data")
            assert attrs == ce, (n, opts)
    # most events take the templates; the rest (see sinks.envelope_template) the reference
    assert templated > CASES // 3, (templated, fell_back)
    assert fell_back > CASES // 10, (templated, fell_back)
    assert escaped > CASES // 20, escaped  # identities that JSON or HTTP headers escape


def test_a_projected_sink_builds_by_the_reference() -> None:
    envelope = RecordingSink(name="t", options=SinkOptions(fields=["metadata.name"]))._envelope
    assert envelope.build == envelope.reference_build
    for opts in ({}, {"compat": "knative"}, {"payload": "merge_patch"}):
        envelope = RecordingSink(name="t", options=SinkOptions.model_validate(opts))._envelope
        assert envelope.build != envelope.reference_build


def test_the_memo_of_sanitised_destination_fields_stays_bounded_without_batches() -> None:
    """``deliver`` builds with the templates too, never through ``batch_builder``: the memo of the
    destination's field values bounds itself."""
    sink = RecordingSink(name="t", options=SinkOptions(destination="{namespace}.{name}"))
    envelope = sink._envelope
    for i in range(17_000):
        pod = RawObject.from_dict({"metadata": {"name": f"p{i}", "uid": "u"}})
        added = ChangeEvent(type=EventType.ADDED, resource=PODS, cluster="c", obj=pod, time=1.7e9)
        msg = envelope.build(added, ack)
        assert msg.destination == f".p{i}"
    assert 0 < len(envelope._sanitized) <= 16_384
