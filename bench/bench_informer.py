"""Informer benchmark: change throughput and memory per cached object, for realistic Pods.

Two numbers the design treats as product metrics:

(a) **deltas/s** through the informer's hot path — reflector → RealFIFO → HandleDeltas → indexer →
    one no-op listener — for realistic Pods (~4 KB of JSON each, managedFields included), fed by an
    in-memory watch stream of already-decoded objects so that JSON decoding is not measured;
(b) **bytes per cached Pod** (tracemalloc) against its raw JSON size, with and without the default
    transform that drops ``metadata.managedFields``.

Run ``python -m bench.bench_informer [--quick]``: prints a table and writes
``bench/results/informer.json``. :func:`run` returns the same numbers for the smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from bridge.clock import RealClock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    KubeObject,
    ListenerOptions,
    ListOptions,
    ListPage,
    WatchEvent,
    WatchEventType,
    WatchOptions,
)
from bridge.informer.shared_informer import SharedIndexInformer
from bridge.informer.store import IndexedCache
from bridge.informer.transform import drop_managed_fields
from bridge.rawobject import to_json

RESULTS = Path(__file__).resolve().parent / "results" / "informer.json"


# --------------------------------------------------------------------------------------------------
# realistic Pods


def make_pod(i: int, rv: int) -> KubeObject:
    """A Pod shaped like one a Deployment creates (~4 KB of JSON): labels, owner, managedFields, status."""
    ns = f"team-{i % 20}"
    app = f"svc-{i % 150}"
    name = f"{app}-7d9f8c6b5-{i:06d}"
    ts = "2026-11-21T10:00:00Z"
    container_fields: dict[str, Any] = {
        "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
        "f:ports": {'k:{"containerPort":8080,"protocol":"TCP"}': {".": {}, "f:containerPort": {},
                                                                   "f:name": {}, "f:protocol": {}}},
        "f:resources": {".": {}, "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}},
                        "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
        "f:env": {'k:{"name":"LOG_LEVEL"}': {".": {}, "f:name": {}, "f:value": {}}},
        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{app}-7d9f8c6b5-",
            "namespace": ns,
            "uid": f"6f1c2b9e-{i:04x}-4c1d-9a7e-{rv:012d}",
            "resourceVersion": str(rv),
            "creationTimestamp": ts,
            "labels": {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "shop",
                       "pod-template-hash": "7d9f8c6b5", "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": ts,
                            "prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": f"{app}-7d9f8c6b5", "uid": f"rs-{i % 150:08d}",
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": ts, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {},
                                                                                "f:pod-template-hash": {}},
                                             "f:ownerReferences": {".": {}, f'k:{{"uid":"rs-{i}"}}': {}}},
                              "f:spec": {"f:containers": {'k:{"name":"app"}': container_fields},
                                         "f:dnsPolicy": {}, "f:restartPolicy": {},
                                         "f:schedulerName": {}, "f:securityContext": {},
                                         "f:terminationGracePeriodSeconds": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": ts,
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {
                     'k:{"type":"ContainersReady"}': {".": {}, "f:lastProbeTime": {},
                                                      "f:lastTransitionTime": {}, "f:status": {},
                                                      "f:type": {}},
                     'k:{"type":"Initialized"}': {".": {}, "f:lastProbeTime": {},
                                                  "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                     'k:{"type":"Ready"}': {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                                            "f:status": {}, "f:type": {}}},
                     "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {},
                     "f:podIPs": {".": {}, 'k:{"ip":"10.1.2.3"}': {".": {}, "f:ip": {}}},
                     "f:startTime": {}}}},
            ],
        },
        "spec": {
            "containers": [
                {"name": c, "image": f"registry.example.com/shop/{app}:{c}-1.{i % 7}.3",
                 "imagePullPolicy": "IfNotPresent",
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                 "env": [{"name": "LOG_LEVEL", "value": "info"}],
                 "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                               "requests": {"cpu": "100m", "memory": "128Mi"}},
                 "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                   "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                 "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "File"}
                for c in ("app",)
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": f"node-{i % 40}",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "hostIP": f"10.0.{i % 40}.10",
            "podIP": f"10.1.{(i // 250) % 250}.{i % 250}",
            "startTime": ts,
            "containerStatuses": [
                {"name": c, "ready": True, "restartCount": 0, "started": True,
                 "state": {"running": {"startedAt": ts}},
                 "image": f"registry.example.com/shop/{app}:{c}-1.{i % 7}.3",
                 "imageID": f"registry.example.com/shop/{app}@sha256:{'ab' * 32}",
                 "containerID": f"containerd://{'cd' * 32}"}
                for c in ("app",)
            ],
            "qosClass": "Burstable",
        },
    }


# --------------------------------------------------------------------------------------------------
# (a) throughput


READ_BATCH = 16
"""Events per batch of the canned stream: about what one 64 KiB read of a watch of ~4 KB Pods holds."""


class _CannedStream:
    """A watch stream that yields pre-built events, then stays open until closed."""

    def __init__(self, events: list[WatchEvent]) -> None:
        self._events = events
        self._closed = asyncio.Event()

    async def _iter(self) -> AsyncIterator[WatchEvent]:
        for event in self._events:
            yield event
        await self._closed.wait()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._iter()

    async def _batches(self) -> AsyncIterator[list[WatchEvent]]:
        events = self._events
        for i in range(0, len(events), READ_BATCH):
            yield events[i:i + READ_BATCH]
        await self._closed.wait()

    def batches(self) -> AsyncIterator[list[WatchEvent]]:
        """The events as an HTTP watch hands them out: what one read of the connection holds (a
        bridge without batched watch streams reads ``__aiter__`` instead)."""
        return self._batches()

    async def close(self) -> None:
        self._closed.set()


class _CannedSource:
    """A ListerWatcher whose list is empty and whose first watch replays the canned events."""

    def __init__(self, events: list[WatchEvent]) -> None:
        self._events = events
        self._served = False

    async def list(self, options: ListOptions) -> ListPage:
        return ListPage(items=[], resource_version="1")

    async def watch(self, options: WatchOptions) -> _CannedStream:
        events, self._served = ([] if self._served else self._events), True
        return _CannedStream(events)


class _NoopHandler:
    def __init__(self, expected: int) -> None:
        self.count = 0
        self._expected = expected
        self.done = asyncio.Event()

    def _tick(self) -> None:
        self.count += 1
        if self.count >= self._expected:
            self.done.set()

    async def on_add(self, obj: KubeObject, is_in_initial_list: bool) -> None:
        self._tick()

    async def on_update(self, old: KubeObject, new: KubeObject) -> None:
        self._tick()

    async def on_delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        self._tick()


async def _throughput(n_pods: int, updates_per_pod: int, transform: bool,
                      compact: bool = False) -> dict[str, Any]:
    events: list[WatchEvent] = []
    rv = 1
    for i in range(n_pods):
        rv += 1
        events.append(WatchEvent(WatchEventType.ADDED, make_pod(i, rv)))
    for _ in range(updates_per_pod):
        for i in range(n_pods):
            rv += 1
            events.append(WatchEvent(WatchEventType.MODIFIED, make_pod(i, rv)))
    total = len(events)
    handler = _NoopHandler(total)
    informer = SharedIndexInformer(
        lister_watcher=_CannedSource(events), clock=RealClock(), name="bench",
        transform=drop_managed_fields if transform else None, compact_cache=compact,
    )
    informer.add_event_handler(handler, ListenerOptions(name="noop", buffer_capacity=1024))
    task = asyncio.create_task(informer.run(), name="bench-informer")
    start = time.perf_counter()
    try:
        await handler.done.wait()
        elapsed = time.perf_counter() - start
    finally:
        await informer.shutdown(5)
        await task
    return {"deltas": total, "seconds": round(elapsed, 4), "deltas_per_second": round(total / elapsed)}


# --------------------------------------------------------------------------------------------------
# (b) memory per cached object


def _memory(n_pods: int, transform: bool, compact: bool = False) -> dict[str, Any]:
    raws = [orjson.dumps(make_pod(i, 1000 + i)) for i in range(n_pods)]
    raw_bytes = sum(len(r) for r in raws) / n_pods
    cache = IndexedCache(compact=compact)
    cache.add(make_pod(-1, 1))  # first-use allocations stay out of the figure
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for raw in raws:
        obj = orjson.loads(raw)
        if transform:
            obj = drop_managed_fields(obj)
        cache.add(obj)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_obj = (after - before) / n_pods
    stored_json = sum(len(to_json(o)) for o in cache.list()) / len(cache)
    return {
        "objects": n_pods,
        "raw_json_bytes": round(raw_bytes),
        "cached_json_bytes": round(stored_json),
        "bytes_per_object": round(per_obj),
        "ratio_to_raw_json": round(per_obj / raw_bytes, 2),
    }


# --------------------------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    """Runs both measurements and returns the results (``quick``: small sizes, for the smoke test)."""
    n_pods, updates, n_mem = (300, 2, 300) if quick else (5000, 4, 10000)
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "quick": quick,
        "throughput": {
            "with_transform": asyncio.run(_throughput(n_pods, updates, transform=True)),
            "without_transform": asyncio.run(_throughput(n_pods, updates, transform=False)),
            "compact_cache": asyncio.run(_throughput(n_pods, updates, transform=True, compact=True)),
        },
        "memory": {
            "with_transform": _memory(n_mem, transform=True),
            "without_transform": _memory(n_mem, transform=False),
            "compact_cache": _memory(n_mem, transform=True, compact=True),
        },
    }
    return results


def _table(results: dict[str, Any]) -> str:
    lines = ["(a) reflector → RealFIFO → indexer → 1 no-op listener, realistic Pods",
             f"{'transform':<20}{'deltas':>10}{'seconds':>10}{'deltas/s':>12}"]
    for label, r in results["throughput"].items():
        lines.append(f"{label:<20}{r['deltas']:>10}{r['seconds']:>10.3f}{r['deltas_per_second']:>12}")
    lines += ["", "(b) memory per cached Pod (tracemalloc)",
              f"{'transform':<20}{'raw JSON':>10}{'kept JSON':>11}{'cached B':>10}{'x raw':>8}"]
    for label, r in results["memory"].items():
        lines.append(f"{label:<20}{r['raw_json_bytes']:>10}{r['cached_json_bytes']:>11}"
                     f"{r['bytes_per_object']:>10}{r['ratio_to_raw_json']:>8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds, for CI)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    print(_table(results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
