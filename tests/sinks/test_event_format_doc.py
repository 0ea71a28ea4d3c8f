"""docs/event-format.md shows real output: every example there must equal what the sinks emit for the
same input. Regenerate the examples with ``python -m tests.sinks.test_event_format_doc``."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from typing import Any

import orjson

from sinks.cloudevents import encode_binary, to_cloudevent
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, GapInfo, ResourceRef, SnapshotInfo
from sinks.file import StdoutSink, StdoutSinkOptions

DOC = Path(__file__).resolve().parents[2] / "docs" / "event-format.md"
PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")
T = 1_714_564_800.5  # 2024-05-01T12:00:00.5Z


def _pod(rv: str, phase: str, *, image: str = "nginx:1.25", ready: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "5f1c1a52-7b9e-4c43-9a54-2d1f0b7c9e11",
            "resourceVersion": rv,
            "labels": {"app": "web"},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}],
        },
        "spec": {"containers": [{"name": "web", "image": image}], "nodeName": "node-1"},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


SNAP = SnapshotInfo(id="pods-prod-1714564800", resource_version="1005")
GAP = GapInfo(id="pods.all.5d1e0b7c9a42:1001:7c1e04a9-1", from_resource_version="1001")
V1, V2 = _pod("1001", "Pending"), _pod("1002", "Running", image="nginx:1.26", ready=True)


def _ev(type_: EventType, obj: dict[str, Any] | None, **kw: Any) -> ChangeEvent:
    return ChangeEvent(type=type_, resource=PODS, cluster="prod", obj=obj, time=T, **kw)


EXAMPLES: dict[str, tuple[ChangeEvent, dict[str, Any]]] = {
    "added": (_ev(EventType.ADDED, V1), {}),
    "updated": (_ev(EventType.UPDATED, V2, old=V1), {}),
    "updated-merge-patch": (_ev(EventType.UPDATED, V2, old=V1), {"payload": "merge_patch"}),
    "deleted": (_ev(EventType.DELETED, V2), {}),
    "deleted-final-state-unknown": (_ev(EventType.DELETED, V2, final_state_unknown=True), {}),
    "snapshot-begin": (_ev(EventType.SNAPSHOT_BEGIN, None, snapshot=SNAP), {}),
    "sync": (_ev(EventType.SYNC, V2, snapshot=SNAP), {}),
    "snapshot-end": (
        _ev(
            EventType.SNAPSHOT_END, None, snapshot=SnapshotInfo(id=SNAP.id, resource_version="1005", count=1)
        ),
        {},
    ),
    "knative-added": (_ev(EventType.ADDED, V1), {"compat": "knative"}),
    "gap-begin": (_ev(EventType.GAP_BEGIN, None, gap=GAP), {}),
    "updated-in-gap": (_ev(EventType.UPDATED, V2, old=V1, gap=GAP), {}),
    "gap-end": (_ev(EventType.GAP_END, None, gap=GapInfo(id=GAP.id, from_resource_version="1001",
                                                          to_resource_version="1090")), {}),
    "heartbeat": (_ev(EventType.HEARTBEAT, None,
                      extensions={"resourceversion": "1090", "ackedresourceversion": "1085"}), {}),
}


async def _emit(event: ChangeEvent, options: dict[str, Any]) -> dict[str, Any]:
    """Runs the event through a real sink pipeline (filters, redaction, payload, envelope)."""
    stream = io.BytesIO()
    sink = StdoutSink(name="doc", options=StdoutSinkOptions.model_validate(options), stream=stream)
    outcomes: list[DeliveryOutcome] = []
    await sink.deliver(event, outcomes.append)
    assert await sink.flush(5)
    await sink.close()
    assert outcomes == [DeliveryOutcome.DELIVERED]
    doc: dict[str, Any] = orjson.loads(stream.getvalue())
    return doc


def binary_headers() -> dict[str, str]:
    ce = to_cloudevent(_ev(EventType.DELETED, V2, final_state_unknown=True))
    headers, _ = encode_binary(ce, "ce-")
    return headers


def doc_examples() -> dict[str, Any]:
    text = DOC.read_text()
    found = re.findall(r"<!-- example: ([\w-]+) -->\s*```json\n(.*?)```", text, re.DOTALL)
    return {name: orjson.loads(body) for name, body in found}


async def test_doc_examples_match_sink_output() -> None:
    examples = doc_examples()
    assert sorted(examples) == sorted([*EXAMPLES, "binary-headers"])
    for name, (event, options) in EXAMPLES.items():
        assert examples[name] == await _emit(event, options), name
    assert examples["binary-headers"] == binary_headers()


def _render() -> str:
    async def run() -> str:
        out = []
        for name, (event, options) in EXAMPLES.items():
            body = orjson.dumps(await _emit(event, options), option=orjson.OPT_INDENT_2).decode()
            out.append(f"<!-- example: {name} -->\n```json\n{body}\n```\n")
        body = orjson.dumps(binary_headers(), option=orjson.OPT_INDENT_2).decode()
        out.append(f"<!-- example: binary-headers -->\n```json\n{body}\n```\n")
        return "\n".join(out)

    return asyncio.run(run())


if __name__ == "__main__":
    print(_render())
