"""No Secret value leaves the bridge: a property test over Secrets in every shape, through real sinks.

Hypothesis builds Secrets with values in ``data`` (base64), ``stringData``, the
``kubectl.kubernetes.io/last-applied-configuration`` annotation (as ``kubectl apply`` writes it, with
the same or older values, or cut short), other annotations and labels quoting a value, and sends
them as added / updated (with the old object) / deleted / sync events in every payload mode through
a file sink and webhooks (structured, binary, batched) posting to a real local HTTP server that
refuses some events with a 400 echoing the body it got (so they reach the dead-letter file with the
server's answer in the reason), and retries others after a 503. Every byte written (sink files, HTTP
requests with their headers, dead letters) and every log record (with tracebacks) is searched for
every value: as written, JSON-escaped, base64-encoded and decoded.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.rawobject import RawObject
from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.base import BaseSink
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, SnapshotInfo
from sinks.file import FileSink
from sinks.redaction import LAST_APPLIED
from sinks.webhook import WebhookSink
from tests.sinks import SECRETS

MARK = "s3cr3t-"
"""Every generated value starts with it, so finding a value in the output is never a coincidence."""

_value_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=4, max_size=24
).map(lambda t: MARK + t)
_value_bytes = st.binary(min_size=4, max_size=24).map(lambda b: MARK.encode() + b)
_keys = st.from_regex(r"[a-z][a-z0-9_.-]{0,10}", fullmatch=True)


@dataclass
class Shape:
    """One Secret and where its values were put."""

    data: dict[str, bytes]
    string_data: dict[str, str]
    applied: str  # "none", "same", "older", "broken"
    older_data: dict[str, bytes]
    quoted_in_annotation: bool
    quoted_in_label: bool
    raw: bool
    values: list[bytes] = field(default_factory=list)


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    data = draw(st.dictionaries(_keys, _value_bytes, max_size=3))
    string_data = draw(st.dictionaries(_keys, _value_text, max_size=3))
    applied = draw(st.sampled_from(["none", "same", "older", "broken"]))
    older = draw(st.dictionaries(_keys, _value_bytes, min_size=1, max_size=2))
    return Shape(
        data=data,
        string_data=string_data,
        applied=applied,
        older_data=older,
        quoted_in_annotation=draw(st.booleans()),
        quoted_in_label=draw(st.booleans()),
        raw=draw(st.booleans()),
    )


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def build_secret(shape: Shape, name: str, rv: int) -> tuple[dict[str, Any], list[bytes]]:
    """The Secret and every value byte-string that must not leave (each in all its spellings)."""
    data = {k: _b64(v) for k, v in shape.data.items()}
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}",
                            "resourceVersion": str(rv)}
    annotations: dict[str, str] = {"team": "payments"}
    labels: dict[str, str] = {"app": "shop"}
    secrets: list[bytes] = list(shape.data.values()) + [v.encode() for v in shape.string_data.values()]
    if shape.applied != "none":
        applied_data = data if shape.applied == "same" else {k: _b64(v) for k, v in shape.older_data.items()}
        if shape.applied == "older":
            secrets += shape.older_data.values()
        applied = {"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": name, "namespace": "default", "annotations": {"team": "payments"}},
                   "data": applied_data, "stringData": shape.string_data, "type": "Opaque"}
        text = orjson.dumps(applied).decode()
        if shape.applied == "broken":
            text = text[: max(1, len(text) - 3)]
        annotations[LAST_APPLIED] = text
    quotable = [v.decode("utf-8", "replace") for v in shape.data.values()] + list(shape.string_data.values())
    if shape.quoted_in_annotation and quotable:
        annotations["note"] = f"rotated to {quotable[0]} today"
    if shape.quoted_in_label and quotable:
        labels["hint"] = quotable[-1]
    meta["annotations"] = annotations
    meta["labels"] = labels
    meta["managedFields"] = [{"manager": "kubectl-client-side-apply", "operation": "Update",
                              "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                              "fieldsV1": {"f:data": {f"f:{k}": {} for k in data}}}]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data,
              "stringData": shape.string_data, "type": "Opaque"}
    return secret, secrets


def spellings(value: bytes) -> list[bytes]:
    """The ways ``value`` could appear in JSON text, a header or a log line."""
    out = [value, base64.b64encode(value)]
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = ""  # binary: it can only appear base64-encoded
    if text:
        out.append(text.encode())
        out.append(orjson.dumps(text)[1:-1])
        out.append(repr(text).encode()[1:-1])
        out.append(text.encode("unicode_escape"))
    return [s for s in out if len(s) > len(MARK)]


@dataclass
class Server:
    """The answers of the webhook (the kit's receiver)."""

    seen: set[str] = field(default_factory=set)

    async def respond(self, request: ReceivedRequest) -> Reply:
        body = request.body
        if b"refuse-me" in body or "refuse-me" in request.headers.get("ce-subject", ""):
            # A server echoing what it got: the reason written to the dead letter quotes it.
            return Reply(400, body=b"bad event: " + body[:300])
        key = request.headers.get("ce-id", "") or str(len(body))
        if b"retry-me" in body and key not in self.seen:
            self.seen.add(key)
            return Reply(503, body="try later " + body[:200].decode("utf-8", "replace"))
        return Reply(204)


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + repr(record.__dict__))


def events_for(shapes_: list[Shape]) -> tuple[list[ChangeEvent], list[bytes]]:
    events: list[ChangeEvent] = []
    secrets: list[bytes] = []
    snap = SnapshotInfo(id="snap-1", resource_version="100")
    for i, shape in enumerate(shapes_):
        name = ("refuse-me-" if i % 3 == 1 else "retry-me-" if i % 3 == 2 else "s-") + str(i)
        old, s_old = build_secret(shape, name, 10 * i + 1)
        newer = Shape(data={k: v + b"-new" for k, v in shape.data.items()},
                      string_data={k: v + "-new" for k, v in shape.string_data.items()},
                      applied=shape.applied, older_data=shape.older_data,
                      quoted_in_annotation=shape.quoted_in_annotation,
                      quoted_in_label=shape.quoted_in_label, raw=shape.raw)
        new, s_new = build_secret(newer, name, 10 * i + 2)
        secrets += s_old + s_new
        if shape.raw:
            old_o: Any = RawObject.from_dict(old)
            new_o: Any = RawObject.from_dict(new)
        else:
            old_o, new_o = old, new
        for type_, o, prev, sn in ((EventType.ADDED, old_o, None, None),
                                   (EventType.UPDATED, new_o, old_o, None),
                                   (EventType.SYNC, new_o, None, snap),
                                   (EventType.DELETED, new_o, None, None)):
            events.append(ChangeEvent(type=type_, resource=SECRETS, cluster="prod", obj=o, old=prev,
                                      time=1_700_000_000.0, snapshot=sn))
    return events, secrets


async def run_sinks(events: list[ChangeEvent], tmp: Path) -> list[bytes]:
    """Everything the sinks wrote or sent, through real sinks and a real HTTP server."""
    server = await WebhookReceiver(path="/hook", respond=Server().respond).start()
    url = server.url
    retry = {"initial": 0.001, "max": 0.002, "max_attempts": 3}
    sinks: list[BaseSink[Any]] = []
    for payload in ("object", "object_and_old", "merge_patch"):
        dead = {"kind": "file", "target": str(tmp / f"dead-file-{payload}.jsonl")}
        sinks.append(FileSink.from_options(f"file-{payload}", {
            "path": str(tmp / f"file-{payload}.jsonl"), "payload": payload, "dead_letter": dead}))
        for mode, batch in (("structured", 1), ("binary", 1), ("structured", 5)):
            label = f"{payload}-{mode}-{batch}"
            sinks.append(WebhookSink.from_options(f"hook-{label}", {
                "url": url, "payload": payload, "content_mode": mode, "batch": {"max_events": batch},
                "retry": retry, "dead_letter": {"kind": "file", "target": str(tmp / f"dead-{label}.jsonl")},
            }))
    outcomes: list[DeliveryOutcome] = []
    try:
        for sink in sinks:
            await sink.start()
            for ev in events:
                await sink.deliver(ev, outcomes.append)
        for sink in sinks:
            assert await sink.flush(20)
    finally:
        for sink in sinks:
            await sink.close()
        await server.close()
    assert len(outcomes) == len(events) * len(sinks)
    assert DeliveryOutcome.DEAD_LETTERED in outcomes or len(events) < 8
    written = [p.read_bytes() for p in sorted(tmp.iterdir())]  # noqa: ASYNC240 (a test, after the run)
    return written + [orjson.dumps(r.headers) + r.body for r in server.requests]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(st.lists(shapes(), min_size=3, max_size=4))
def test_no_secret_value_reaches_any_sink_dead_letter_or_log(
    tmp_path_factory: Any, shapes_: list[Shape]
) -> None:
    tmp = tmp_path_factory.mktemp("leaks")
    events, secrets = events_for(shapes_)
    capture = Capture()
    root = logging.getLogger()
    level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        outputs = asyncio.run(run_sinks(events, tmp))
    finally:
        root.removeHandler(capture)
        root.setLevel(level)
    assert any(b"s-0" in out for out in outputs)  # the outputs were really collected
    logs = "\n".join(capture.lines).encode()
    haystack = [*outputs, logs]
    for value in secrets:
        for spelling in spellings(value):
            for out in haystack:
                assert spelling not in out, (value, spelling, out[:2000])
