"""An in-process kube-apiserver simulator for the bridge's tests, demo and benchmarks.

No kube-apiserver can be installed where the bridge is developed, so this package serves the part of
its HTTP contract the bridge relies on, with a churn generator for load::

    async with Simulator(bookmark_interval=0.5, crds=[{"group": "example.com", "version": "v1",
                                                       "plural": "widgets", "kind": "Widget"}]) as sim:
        sim.write_kubeconfig(path)                 # any client can connect
        sim.store.create("pods", make_pod("web-1", "default"))
        sim.set_faults(watch_close_after=3)        # or POST /_sim/faults
        sim.expire_watches(); sim.compact()        # 410s on demand

Modules: ``resources`` (served types, discovery), ``store`` (objects, the global resourceVersion,
history, watchers), ``openapi`` (the kinds' schemas, OpenAPI v2/v3), ``openapi_proto`` (the v2
document in protobuf, which kubectl reads), ``strategic`` (strategic merge patch), ``managed``
(managedFields, server-side apply), ``tables`` (``kubectl get`` tables), ``status`` (errors as
``Status`` objects), ``faults``, ``server`` (HTTP), ``objects`` (realistic Pods), ``churn`` (load),
``cli`` (``python -m bridge.sim``).

kubectl (1.30+) and the official client use it as a cluster: aggregated discovery with categories,
OpenAPI for validation and ``kubectl explain``, strategic merge patch, server-side apply with field
ownership, dry runs, Table responses, the scale subresource, SelfSubjectAccessReview (``forbidden``
resources are denied). It runs no controllers.

Admin endpoint (no auth, never delayed or failed by faults): ``GET|POST /_sim/faults`` (read, amend;
``{"reset": true, ...}`` replaces; ``"expire_watches": true`` and ``"compact": true`` act at once),
``POST /_sim/compact``, ``POST /_sim/expire-watches``, ``POST /_sim/crds`` (one CRD or a list),
``GET /_sim/state`` (resourceVersion, object counts, compaction points, open watches, requests, faults).
"""

from __future__ import annotations

from bridge.sim.churn import ChurnGenerator, ChurnMix, ChurnStats
from bridge.sim.cli import sim_main
from bridge.sim.faults import FaultSpec, FaultState, FaultTarget
from bridge.sim.objects import make_pod
from bridge.sim.resources import BUILTIN_RESOURCES, ResourceRegistry, ResourceType, UnknownResourceError
from bridge.sim.server import INITIAL_EVENTS_END_ANNOTATION, Simulator
from bridge.sim.store import ObjectStore, PatchType, Watcher, WatchFilter

__all__ = [
    "BUILTIN_RESOURCES",
    "INITIAL_EVENTS_END_ANNOTATION",
    "ChurnGenerator",
    "ChurnMix",
    "ChurnStats",
    "FaultSpec",
    "FaultState",
    "FaultTarget",
    "ObjectStore",
    "PatchType",
    "ResourceRegistry",
    "ResourceType",
    "Simulator",
    "UnknownResourceError",
    "WatchFilter",
    "Watcher",
    "make_pod",
    "sim_main",
]
