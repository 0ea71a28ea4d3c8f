"""The worked examples of docs/filters.md, end to end: the simulator's changes through a running
service to a file sink and a Kafka topic (the Tansu broker) per example. Each sink gets exactly the
events its expression matches, every snapshot marker, and each object's events in their order; an
expression failing on some objects keeps or drops them as configured and counts them in
``keb_sink_filter_errors_total`` (read from /metrics)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from tests import brokers
from tests.brokers import TansuBroker, unique_name
from tests.service.in_process import running_service, simulator_config
from tests.service.test_service import eventually, get, lines, metric

pytestmark = pytest.mark.usefixtures("own_cwd")

kafka_broker = brokers.kafka_broker

Event = dict[str, Any]

# The expressions exactly as docs/filters.md shows them (test_the_documented_expressions_are_these).
EXAMPLES: dict[str, tuple[list[str], str]] = {
    "warnings": (["events"], "object.type == 'Warning'"),
    "failed": (["pods"], "object.status.phase == 'Failed' && "
                         "(oldObject == null || oldObject.status.phase != 'Failed')"),
    "images": (["deployments.apps"], "oldObject != null && "
                                     "object.spec.template.spec.containers.map(c, c.image) != "
                                     "oldObject.spec.template.spec.containers.map(c, c.image)"),
    "owned": (["pods"], "has(object.metadata.ownerReferences) && "
                        "object.metadata.ownerReferences.exists(o, o.kind == 'Job')"),
    "team": ([], "object.metadata.?labels.team.orValue('') == 'payments'"),
}


def _images(obj: Event | None) -> list[str] | None:
    if obj is None:
        return None
    return [c["image"] for c in obj["spec"]["template"]["spec"]["containers"]]


# The same conditions written in Python: what each sink must have received.
EXPECTED: dict[str, Callable[[Event, Event | None], bool]] = {
    "warnings": lambda o, old: o.get("type") == "Warning",
    "failed": lambda o, old: o["status"]["phase"] == "Failed" and (old is None
                                                                   or old["status"]["phase"] != "Failed"),
    "images": lambda o, old: old is not None and _images(o) != _images(old),
    "owned": lambda o, old: any(r["kind"] == "Job" for r in o["metadata"].get("ownerReferences", [])),
    "team": lambda o, old: (o["metadata"].get("labels") or {}).get("team") == "payments",
}

SIZES = {
    "warnings": 4,  # e2, e3 added Warning; e1 updated to Warning; e2 deleted (still a Warning)
    "failed": 8,  # p4 added Failed, p0 and p1 became Failed; the snapshot: 2 markers, p0 p1 p4 synced
    "images": 2,  # web 1.25 → 1.26, api 1.0 → 1.1 (not the replica changes)
    "owned": 7,  # p2 p3 added, p2 updated, p3 deleted; the snapshot: 2 markers, p2 synced
    "team": 12,  # p1 p3 p5 added, p1 updated, p3 deleted, web added and updated twice; 2 markers, p1 p5
}

KINDS = {"events": "Event", "pods": "Pod", "deployments.apps": "Deployment"}


def deployment(name: str, image: str, team: str | None = None) -> Event:
    labels = {"app": name, **({"team": team} if team else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "shop", "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": image}]}}}}


def k8s_event(name: str, type_: str, reason: str) -> Event:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "shop"},
            "type": type_, "reason": reason, "message": f"{reason} happened",
            "involvedObject": {"kind": "Pod", "name": "p0", "namespace": "shop"}}


async def changes(sim: Simulator) -> None:
    """Creates, updates and deletes objects of which some match each example, some do not."""
    store = sim.store
    for i in range(6):
        pod = make_pod(f"p{i}", "shop")
        if i % 2:
            pod["metadata"]["labels"]["team"] = "payments"
        if i in (2, 3):
            pod["metadata"]["ownerReferences"][0].update(kind="Job", apiVersion="batch/v1", name="nightly")
        if i == 4:
            pod["status"]["phase"] = "Failed"  # added already failed
        store.create("pods", pod)
    store.create("deployments.apps", deployment("web", "nginx:1.25", team="payments"))
    store.create("deployments.apps", deployment("api", "api:1.0"))
    store.create("events", k8s_event("e1", "Normal", "Scheduled"))
    store.create("events", k8s_event("e2", "Warning", "BackOff"))
    store.create("events", k8s_event("e3", "Warning", "FailedMount"))
    await asyncio.sleep(0.3)
    for step, (name, phase) in enumerate([("p0", "Failed"), ("p1", "Failed"), ("p0", "Failed"),
                                          ("p2", "Succeeded")]):
        pod = copy.deepcopy(store.get("pods", name, namespace="shop"))
        pod["status"]["phase"] = phase
        pod["status"]["message"] = f"step {step}"
        store.update("pods", pod, subresource="status")
    for name, image, replicas in [("web", "nginx:1.26", 1), ("api", "api:1.0", 3), ("web", "nginx:1.26", 2),
                                  ("api", "api:1.1", 3)]:
        dep = copy.deepcopy(store.get("deployments.apps", name, namespace="shop"))
        dep["spec"]["replicas"] = replicas
        dep["spec"]["template"]["spec"]["containers"][0]["image"] = image
        store.update("deployments.apps", dep)
    ev = copy.deepcopy(store.get("events", "e1", namespace="shop"))
    ev["type"] = "Warning"
    store.update("events", ev)
    store.delete("pods", "p3", namespace="shop")
    store.delete("events", "e2", namespace="shop")


def key(ce: Event) -> tuple[Any, ...]:
    """An event, the same in every sink (a snapshot's id is each sink's own, so not the event id)."""
    return ce["type"], ce["kind"], ce.get("subject", ""), ce.get("resourceversion", ce.get("snapshotrv", ""))


def is_marker(ce: Event) -> bool:
    return "subject" not in ce


def subject_of(ce: Event) -> tuple[str, str]:
    return ce["kind"], ce.get("subject", "")


def check_sink(name: str, got: list[Event], everything: list[Event]) -> None:
    resources, _ = EXAMPLES[name]
    kinds = {KINDS[r] for r in resources} if resources else set(KINDS.values())
    wanted = []
    for ce in everything:
        if ce["kind"] not in kinds:
            continue
        if is_marker(ce) or EXPECTED[name](ce["data"]["object"], ce["data"]["oldObject"]):
            wanted.append(key(ce))
    got_keys = [key(ce) for ce in got]
    assert sorted(got_keys) == sorted(wanted), name
    assert len(set(got_keys)) == len(got_keys), name
    # each object's events, and the markers, in the order the bridge produced them
    position = {key(ce): i for i, ce in enumerate(everything)}
    by_object: dict[tuple[str, str], list[int]] = {}
    for ce in got:
        by_object.setdefault(subject_of(ce), []).append(position[key(ce)])
    for subject, order in by_object.items():
        assert order == sorted(order), (name, subject)
    markers = [ce for ce in got if is_marker(ce)]
    assert [m["type"] for m in markers] == [m["type"] for m in everything
                                             if is_marker(m) and m["kind"] in kinds]
    assert any(m["type"].endswith("snapshot.begin") for m in markers) or name in ("warnings", "images")


async def test_each_documented_example_sends_exactly_its_events_to_file_and_kafka(
    tmp_path: Path, kafka_broker: TansuBroker
) -> None:
    topics = {name: unique_name(f"cel-{name}") for name in EXAMPLES}
    for topic in topics.values():
        kafka_broker.create_topic(topic, partitions=2)
    sinks: list[dict[str, Any]] = [
        {"name": "all", "kind": "file", "path": str(tmp_path / "all.jsonl"), "payload": "object_and_old"},
        {"name": "errors-keep", "kind": "file", "path": str(tmp_path / "keep.jsonl"),
         "filter": "object.spec.nodeName.startsWith('node-')"},
        {"name": "errors-drop", "kind": "file", "path": str(tmp_path / "drop.jsonl"),
         "filter": "object.spec.nodeName.startsWith('node-')", "filter_errors": "drop"},
    ]
    for name, (resources, expression) in EXAMPLES.items():
        common = {"filter": expression, "routing": {"resources": resources}, "payload": "object_and_old"}
        sinks.append({"name": f"{name}-file", "kind": "file", "path": str(tmp_path / f"{name}.jsonl"),
                      **common})
        sinks.append({"name": f"{name}-kafka", "kind": "kafka", "brokers": kafka_broker.bootstrap,
                      "destination": topics[name], "linger_ms": 1, **common})
    async with Simulator() as sim:
        config = simulator_config(sim, tmp_path, sinks=sinks, resources=[
            {"resource": "pods"}, {"resource": "deployments.apps"}, {"resource": "events"}])
        async with running_service(config) as service:
            await eventually(lambda: service.readiness().ready, timeout=30, what="readiness")
            await changes(sim)
            pipeline = service._state.pipeline
            assert pipeline is not None
            everything_path = tmp_path / "all.jsonl"
            # 6 pods + 2 deployments + 3 events added, 4 + 4 + 1 updated, 2 deleted
            await eventually(lambda: len(lines(everything_path)) == 22, timeout=30, what="22 changes")
            await pipeline.snapshot_now("pods")
            await eventually(lambda: len(lines(everything_path)) == 22 + 7, timeout=30, what="a snapshot")
            # the file sinks have written what they will (the sizes are checked below, precisely)
            def written(path: Path, size: int) -> Callable[[], bool]:
                return lambda: len(lines(path)) >= size

            for name, size in SIZES.items():
                await eventually(written(tmp_path / f"{name}.jsonl", size), timeout=30, what=name)
            await eventually(lambda: len(lines(tmp_path / "keep.jsonl")) >= 29, timeout=30, what="keep")
            await eventually(lambda: len(lines(tmp_path / "drop.jsonl")) >= 18, timeout=30, what="drop")
            _, text = await get(f"http://127.0.0.1:{service.health.port}/metrics")

    everything = lines(tmp_path / "all.jsonl")
    assert len(everything) == 29
    for name in EXAMPLES:
        from_file = lines(tmp_path / f"{name}.jsonl")
        check_sink(name, from_file, everything)
        records = kafka_broker.read_all(topics[name], expect=len(from_file))
        from_kafka = [orjson.loads(r.value or b"") for r in records]
        check_sink(name, from_kafka, everything)
        assert sorted(key(ce) for ce in from_kafka) == sorted(key(ce) for ce in from_file)
    # nothing matched by accident: each example sends some events and filters others
    assert {name: len(lines(tmp_path / f"{name}.jsonl")) for name in EXAMPLES} == SIZES

    # An expression failing on the objects without spec.nodeName (Deployments, Events)
    failing = [ce for ce in everything if not is_marker(ce) and ce["kind"] != "Pod"]
    pods = [ce for ce in everything if ce["kind"] == "Pod"]
    keep, drop = lines(tmp_path / "keep.jsonl"), lines(tmp_path / "drop.jsonl")
    assert sorted(map(key, keep)) == sorted(map(key, [*pods, *failing]))
    assert sorted(map(key, drop)) == sorted(map(key, pods))
    assert metric(text, "keb_sink_filter_errors_total", sink="errors-keep") == len(failing)
    assert metric(text, "keb_sink_filter_errors_total", sink="errors-drop") == len(failing)
    assert metric(text, "keb_sink_filter_errors_total", sink="failed-file") == 0


def test_the_documented_expressions_are_these() -> None:
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "filters.md").read_text().split())
    for _, expression in EXAMPLES.values():
        assert expression in doc, expression
