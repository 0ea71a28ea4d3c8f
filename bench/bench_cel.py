"""What a sink's CEL ``filter`` costs per event and what ``fields`` saves (docs/filters.md).

For each worked example of docs/filters.md, on whole objects as the informer hands them (a Pod of
about 4.5 KB from the simulator's generator, kept as its JSON bytes and decoded as far as it is
read, its managedFields cut as the informer's default transform does), this measures:

- ``filter_us``: one :meth:`sinks.cel.CelFilter.decide` per event, on a fresh event each time (no
  verdict remembered): the pruning to what the expression reads, redaction, the conversion into CEL
  values and the evaluation; ``filter_decoded_us`` the same on an object already decoded (another
  sink or the change filter read it first);
- ``whole_us``: the same expression handed the whole object (what it costs without the syntax
  tree's paths), for comparison;
- ``bytes_whole`` / ``bytes_projected``: the structured CloudEvent's size without and with the
  example's ``fields``.

Times are this process's CPU time (best of several rounds), so that a machine shared with other
work still gives the filter's own cost. It also times the filter step of a sink without a filter (a
None check) per event, and the target (``target_us`` = 25 µs per event on whole Pods). Run
``python -m bench.bench_cel`` (``--quick`` for fewer rounds) or as the harness's ``cel`` scenario;
results go to ``bench/results/cel.json``.
"""

from __future__ import annotations

import argparse
import copy
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.common import write_result
from bridge.rawobject import RawObject
from bridge.sim.objects import make_pod
from sinks.base import BaseSink
from sinks.cel import CelFilter, compile_expression
from sinks.contract import ChangeEvent, EventType, ResourceRef
from sinks.options import SinkOptions
from sinks.redaction import Redactor

__all__ = ["EXAMPLES", "TARGET_US", "run"]

TARGET_US = 25.0

PODS = ResourceRef(group="", version="v1", resource="pods", kind="Pod")
DEPLOYMENTS = ResourceRef(group="apps", version="v1", resource="deployments", kind="Deployment")
EVENTS = ResourceRef(group="", version="v1", resource="events", kind="Event")

# name → (resource, expression, fields): the expressions of docs/filters.md
EXAMPLES: dict[str, tuple[ResourceRef, str, list[str]]] = {
    "warnings": (EVENTS, "object.type == 'Warning'",
                 ["reason", "message", "involvedObject", "count", "lastTimestamp"]),
    "failed": (PODS, "object.status.phase == 'Failed' && "
                     "(oldObject == null || oldObject.status.phase != 'Failed')",
               ["metadata.name", "metadata.namespace", "status.phase", "status.reason", "status.message"]),
    "images": (DEPLOYMENTS, "oldObject != null && "
                            "object.spec.template.spec.containers.map(c, c.image) != "
                            "oldObject.spec.template.spec.containers.map(c, c.image)",
               ["metadata.name", "spec.template.spec.containers.*.image"]),
    "owned": (PODS, "has(object.metadata.ownerReferences) && "
                    "object.metadata.ownerReferences.exists(o, o.kind == 'Job')",
              ["metadata.name", "metadata.ownerReferences", "status.phase"]),
    "team": (PODS, "object.metadata.?labels.team.orValue('') == 'payments'",
             ["metadata.name", "metadata.labels", "status.phase"]),
}


def _deployment(pod: dict[str, Any], image: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta["labels"],
                         "annotations": meta.get("annotations", {}), "uid": meta["uid"],
                         "resourceVersion": "7", "generation": 3},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": meta["labels"]["app"]}},
                     "template": {"metadata": {"labels": meta["labels"]},
                                  "spec": dict(pod["spec"], containers=[
                                      dict(c, image=image) for c in pod["spec"]["containers"]])}},
            "status": {"replicas": 3, "readyReplicas": 3, "observedGeneration": 3}}


def _event(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": meta["name"] + ".17a", "namespace": meta["namespace"], "uid": meta["uid"],
                         "resourceVersion": "9"},
            "type": "Warning", "reason": "BackOff", "count": 4,
            "message": "Back-off restarting failed container app in pod " + meta["name"],
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"], "apiVersion": "v1"},
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:05:00Z"}


def _objects(example: str, n: int) -> list[tuple[bytes, bytes | None]]:
    """``n`` (object, old object) pairs as JSON bytes, about half of them matching."""
    rng = random.Random(example)
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(n):
        pod = make_pod(f"web-{i}", "shop", rng=rng)
        pod["metadata"].update(uid=f"uid-{i}", resourceVersion=str(10 + i))
        hit = i % 2 == 0
        if example == "warnings":
            ev = _event(pod)
            ev["type"] = "Warning" if hit else "Normal"
            out.append((orjson.dumps(ev), None))
        elif example == "images":
            old = _deployment(pod, "ghcr.io/acme/web:1.0")
            new = _deployment(pod, "ghcr.io/acme/web:1.1" if hit else "ghcr.io/acme/web:1.0")
            out.append((orjson.dumps(new), orjson.dumps(old)))
        else:
            old = copy.deepcopy(pod)
            if example == "failed" and hit:
                pod["status"]["phase"] = "Failed"
            if example == "owned" and hit:
                pod["metadata"]["ownerReferences"][0]["kind"] = "Job"
            if example == "team" and hit:
                pod["metadata"]["labels"]["team"] = "payments"
            out.append((orjson.dumps(pod), orjson.dumps(old)))
    return out


def _object(raw: bytes, decoded: bool) -> Any:
    """As the informer hands it: managedFields cut (its default transform), kept as bytes."""
    obj = RawObject.from_dict(orjson.loads(raw)).without_managed_fields().fresh()
    return obj.copy_dict() if decoded else obj


def _events(resource: ResourceRef, pairs: list[tuple[bytes, bytes | None]],
            decoded: bool) -> list[ChangeEvent]:
    events = []
    for new, old in pairs:
        obj = _object(new, decoded)
        before = None if old is None else _object(old, decoded)
        events.append(ChangeEvent(type=EventType.UPDATED, resource=resource, cluster="bench", obj=obj,
                                  old=before, time=1_700_000_000.0))
    return events


def _per_event_us(make: Callable[[], list[ChangeEvent]], decide: Callable[[ChangeEvent], int],
                  rounds: int) -> tuple[float, int]:
    best = float("inf")
    passed = 0
    for _ in range(rounds):
        events = make()  # fresh objects each round: nothing decoded or remembered from the last
        started = time.process_time()  # CPU time: what the filter costs, not what other processes take
        verdicts = [decide(e) for e in events]
        best = min(best, (time.process_time() - started) / len(events) * 1e6)
        passed = sum(1 for v in verdicts if v == 1)
    return best, passed


def _measure(resource: ResourceRef, pairs: list[tuple[bytes, bytes | None]], decoded: bool,
             flt: CelFilter, rounds: int) -> tuple[float, int]:
    return _per_event_us(lambda: _events(resource, pairs, decoded), flt._evaluate, rounds)


class _Null(BaseSink[SinkOptions]):
    kind = "null"


def _no_filter_step_ns(n: int) -> float:
    """The filter step of ``deliver_batch`` for a sink without a filter: one None check per event."""
    sink = _Null(name="null", options=SinkOptions())
    rejects = None if sink._filter is None else sink._rejects
    events = _events(PODS, _objects("team", 50), decoded=False)
    started = time.perf_counter()
    count = 0
    for _ in range(n // len(events)):
        for event in events:
            if rejects is not None and rejects(event):
                count += 1
    return (time.perf_counter() - started) / (n // len(events) * len(events)) * 1e9


def run(quick: bool = False, out: Path | None = None) -> dict[str, Any]:
    n = 200 if quick else 1000
    rounds = 3 if quick else 7
    redactor = Redactor()
    results: dict[str, Any] = {}
    for name, (resource, expression, fields) in EXAMPLES.items():
        compiled = compile_expression(expression)
        pairs = _objects(name, n)
        pruned = CelFilter(expression=compiled, redactor=redactor)
        whole = CelFilter(expression=compiled, redactor=redactor)
        whole._obj_plan = whole._old_plan = None  # the whole objects, as without the syntax tree's paths
        filter_us, passed = _measure(resource, pairs, False, pruned, rounds)
        decoded_us, passed_decoded = _measure(resource, pairs, True, pruned, rounds)
        whole_us, passed_whole = _measure(resource, pairs, True, whole, rounds)
        assert passed == passed_decoded == passed_whole, (name, passed, passed_decoded, passed_whole)
        sink = _Null(name="null", options=SinkOptions())
        projected = _Null(name="null", options=SinkOptions(fields=fields))
        sample = _events(resource, pairs[:1], False)[0]
        bytes_whole = len(sink._build(sample, lambda _: None).body)
        bytes_projected = len(projected._build(sample, lambda _: None).body)
        results[name] = {
            "expression": expression,
            "object_bytes": len(pairs[0][0]),
            "reads": [".".join(p) for p in compiled.reads.object_paths or ()],
            "filter_us": round(filter_us, 2),
            "filter_decoded_us": round(decoded_us, 2),
            "whole_us": round(whole_us, 2),
            "passed": passed,
            "events": n,
            "fields": fields,
            "bytes_whole": bytes_whole,
            "bytes_projected": bytes_projected,
            "bytes_saved_pct": round(100 * (1 - bytes_projected / bytes_whole), 1),
            "meets_target": filter_us <= TARGET_US,
        }
    summary = {"examples": results, "target_us": TARGET_US,
               "no_filter_step_ns": round(_no_filter_step_ns(200_000 if not quick else 50_000), 1)}
    write_result("cel", summary, out)
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'example':<10} {'bytes':>6} {'filter µs':>10} {'decoded µs':>11} {'whole µs':>9} "
             f"{'CE bytes':>9} {'projected':>10} {'saved':>6}"]
    for name, r in summary["examples"].items():
        lines.append(f"{name:<10} {r['object_bytes']:>6} {r['filter_us']:>10.2f} "
                     f"{r['filter_decoded_us']:>11.2f} {r['whole_us']:>9.2f} {r['bytes_whole']:>9} "
                     f"{r['bytes_projected']:>10} "
                     f"{r['bytes_saved_pct']:>5.1f}%")
    lines.append(f"sink without a filter: {summary['no_filter_step_ns']} ns per event for the filter step "
                 f"(target for a filter: ≤ {summary['target_us']} µs per event)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(table(run(args.quick)))


if __name__ == "__main__":
    main()
