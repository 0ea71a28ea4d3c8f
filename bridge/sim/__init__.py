"""An in-process kube-apiserver simulator for the bridge's tests, demo and benchmarks.

No kube-apiserver can be installed where the bridge is developed, so this package serves the part of
its HTTP contract the bridge relies on (see ``server.py``), with a churn generator for load.
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
