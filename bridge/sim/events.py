"""Kubernetes Events as a cluster emits them, for the simulator's users (tests, demo, benchmarks).

A cluster's Events are not a uniform stream of new objects: most changes are *repetitions* (the
kubelet's ``BackOff`` or a probe's ``Unhealthy`` seen again bumps the Event's ``count``, or its
``series.count`` in ``events.k8s.io``), they come in bursts (a rollout, a node going away), they name
objects that exist, objects already deleted (``Killing`` after the Pod went) and objects deleted and
re-created under the same name (another uid), and they expire (the API server deletes them after a
TTL). :class:`EventGenerator` produces that, against :class:`~bridge.sim.store.ObjectStore` directly:

- a population of Deployments → ReplicaSets → Pods (controller owner references, ``app`` / ``team``
  labels), the involved objects;
- per operation: a new Event (core ``v1`` or ``events.k8s.io/v1``, by ``new_api_share``) about a
  live Pod (most), a ReplicaSet or Deployment, or a Pod already deleted; a repetition of a live
  Event (count / series bump); a Pod deleted (after a ``Killing`` Event about it) and re-created
  under its name; and, past ``max_events`` live Events, the oldest one expiring (deleted);
- bursts: every ``burst_every`` seconds, ``burst_factor`` times the rate for ``burst_length``.

Every new Event is written to :attr:`EventGenerator.ledger` (and to ``ledger_path`` as JSON lines):
its uid, API, the involved object's uid and whether that object existed when the Event was created,
with its labels then — what a test needs to judge enrichment; and so is every Pod deletion, with
its wall time (:attr:`EventGenerator.deleted`). The file also has every repetition (``bumped``:
the Event's uid, its new count and the wall time read before the change was stored).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from bridge.clock import Clock, RealClock
from bridge.sim.status import SimStatusError
from bridge.sim.store import ObjectStore

__all__ = ["EventGenerator", "EventStats", "LedgerEntry"]

_NORMAL = ("Scheduled", "Pulling", "Pulled", "Created", "Started", "SuccessfulCreate", "ScalingReplicaSet")
_WARNING = ("BackOff", "Unhealthy", "FailedScheduling", "FailedMount", "FailedCreatePodSandBox")
_TEAMS = ("payments", "search", "platform", "checkout")
_MAX_BATCH = 500


@dataclass(slots=True)
class EventStats:
    created: int = 0
    bumped: int = 0
    expired: int = 0
    pods_deleted: int = 0
    pods_recreated: int = 0
    about_gone: int = 0

    @property
    def changes(self) -> int:
        """Event changes made (creates, bumps, expiries): what a watcher of both APIs sees."""
        return self.created + self.bumped + self.expired


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    uid: str
    api: str
    """``v1`` or ``events.k8s.io/v1``."""
    namespace: str
    name: str
    reason: str
    type: str
    involved_kind: str
    involved_uid: str
    existed: bool
    """Whether the involved object existed when the Event was created."""
    labels: dict[str, str] = field(default_factory=dict)
    owner_top: str = ""
    """``Kind/name`` of the involved object's top controller, when it existed."""


def _now(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _micro(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1e6):06d}Z"


class EventGenerator:
    def __init__(self, *, store: ObjectStore, rate: float = 100.0, namespaces: Sequence[str] = ("default",),
                 deployments: int = 10, pods_per_deployment: int = 5, max_events: int = 5000,
                 new_share: float = 0.3, new_api_share: float = 0.5, lifecycle_share: float = 0.02,
                 gone_share: float = 0.05, burst_every: float = 0.0, burst_factor: float = 5.0,
                 burst_length: float = 1.0, seed: int | None = None, clock: Clock | None = None,
                 ledger_path: str | Path | None = None) -> None:
        if rate <= 0:
            raise ValueError("events rate must be positive (Event changes per second)")
        if not namespaces:
            raise ValueError("at least one namespace is needed")
        self.store = store
        self.rate = float(rate)
        self.namespaces = tuple(namespaces)
        self.max_events = max_events
        self.new_share = new_share
        self.new_api_share = new_api_share
        self.lifecycle_share = lifecycle_share
        self.gone_share = gone_share
        self.burst_every = burst_every
        self.burst_factor = burst_factor
        self.burst_length = burst_length
        self.stats = EventStats()
        self.ledger: list[LedgerEntry] = []
        self.deleted: list[tuple[str, float]] = []
        """(uid, wall time) of every Pod deleted (also in the ledger file, as ``{"deleted_pod", "at"}``)."""
        self._rng = random.Random(seed)
        self._clock: Clock = clock or RealClock()
        self._ledger_file: IO[bytes] | None = open(ledger_path, "ab") if ledger_path else None  # noqa: SIM115
        self._pods: list[tuple[str, str]] = []
        """(namespace, name) of the live Pods."""
        self._pod_index: dict[tuple[str, str], int] = {}
        self._pod_template: dict[tuple[str, str], tuple[str, str, str]] = {}
        """Pod → (ReplicaSet name, ReplicaSet uid, Deployment name): how to re-create it."""
        self._controllers: list[tuple[str, str, str, str]] = []
        """(kind, apiVersion, namespace, name) of the ReplicaSets and Deployments."""
        self._gone: list[tuple[str, str, str]] = []
        """(namespace, name, uid) of Pods deleted (the last 1000), for Events about gone objects."""
        self._events: list[tuple[str, str, str]] = []
        """(resource, namespace, name) of the live Events, oldest first."""
        self._event_about: dict[tuple[str, str, str], str] = {}
        """Live Event → the uid of the object it is about."""
        self._gone_uids: set[str] = set()
        """Uids of every Pod deleted."""
        self._serial = 0
        self._stopped = False
        for ns in self.namespaces:
            if not store.list("namespaces", field_selector=f"metadata.name={ns}"):
                store.create("namespaces", {"metadata": {"name": ns}})
        for i in range(deployments):
            ns = self.namespaces[i % len(self.namespaces)]
            self._make_workload(ns, f"app-{i:03d}", _TEAMS[i % len(_TEAMS)], pods_per_deployment)

    # ------------------------------------------------------------------ involved objects

    def _make_workload(self, ns: str, app: str, team: str, pods: int) -> None:
        labels = {"app": app, "team": team}
        dep = self.store.create("deployments.apps", {
            "metadata": {"name": app, "namespace": ns, "labels": labels},
            "spec": {"replicas": pods, "selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": app, "image": f"registry/{app}:1"}]}}},
        }, namespace=ns)
        rs_name = f"{app}-{self._word(10)}"
        rs = self.store.create("replicasets.apps", {
            "metadata": {"name": rs_name, "namespace": ns, "labels": {**labels, "pod-template-hash": "h"},
                         "ownerReferences": [self._ref(dep, "Deployment", "apps/v1")]},
            "spec": {"replicas": pods, "selector": {"matchLabels": {"app": app}}},
        }, namespace=ns)
        self._controllers += [("Deployment", "apps/v1", ns, app), ("ReplicaSet", "apps/v1", ns, rs_name)]
        for _ in range(pods):
            self._make_pod(ns, f"{rs_name}-{self._word(5)}", rs_name, rs["metadata"]["uid"], app)

    @staticmethod
    def _ref(owner: dict[str, Any], kind: str, api_version: str) -> dict[str, Any]:
        return {"apiVersion": api_version, "kind": kind, "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def _make_pod(self, ns: str, name: str, rs_name: str, rs_uid: str, app: str) -> dict[str, Any]:
        team = _TEAMS[int(app.rsplit("-", 1)[-1]) % len(_TEAMS)] if app[-1].isdigit() else _TEAMS[0]
        pod = self.store.create("pods", {
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"app": app, "team": team, "pod-template-hash": "h"},
                         "annotations": {"example.com/owner-team": team},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": rs_name, "uid": rs_uid, "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"containers": [{"name": app, "image": f"registry/{app}:1"}], "nodeName": "node-1"},
        }, namespace=ns)
        key = (ns, name)
        self._pod_index[key] = len(self._pods)
        self._pods.append(key)
        self._pod_template[key] = (rs_name, rs_uid, app)
        return pod

    def _word(self, n: int) -> str:
        return "".join(self._rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))

    def _drop_pod(self, key: tuple[str, str]) -> None:
        idx = self._pod_index.pop(key)
        last = self._pods.pop()
        if idx < len(self._pods):
            self._pods[idx] = last
            self._pod_index[last] = idx

    # ------------------------------------------------------------------ Events

    def _new_event(self, involved: dict[str, Any] | None, *, kind: str, api_version: str, ns: str, name: str,
                   uid: str, reason: str | None = None, warning: bool | None = None) -> None:
        wall = self._clock.wall()
        if warning is None:
            warning = self._rng.random() < 0.3
        if reason is None:
            reason = self._rng.choice(_WARNING if warning else _NORMAL)
        etype = "Warning" if warning else "Normal"
        self._serial += 1
        ev_name = f"{name}.{self._serial:x}{self._word(6)}"
        new_api = self._rng.random() < self.new_api_share
        ref = {"kind": kind, "namespace": ns, "name": name, "uid": uid, "apiVersion": api_version}
        message = f"{reason}: {kind.lower()} {name} ({self._word(4)})"
        if new_api:
            resource = "events.events.k8s.io"
            body: dict[str, Any] = {
                "metadata": {"name": ev_name, "namespace": ns}, "regarding": ref, "reason": reason,
                "type": etype, "note": message, "action": reason, "eventTime": _micro(wall),
                "reportingController": "kubelet", "reportingInstance": "node-1",
            }
        else:
            resource = "events"
            body = {
                "metadata": {"name": ev_name, "namespace": ns}, "involvedObject": ref, "reason": reason,
                "type": etype, "message": message, "count": 1, "firstTimestamp": _now(wall),
                "lastTimestamp": _now(wall), "source": {"component": "kubelet", "host": "node-1"},
                "reportingComponent": "kubelet",
            }
        created = self.store.create(resource, body, namespace=ns, copy=False)
        self._events.append((resource, ns, ev_name))
        self._event_about[(resource, ns, ev_name)] = uid
        self.stats.created += 1
        labels: dict[str, str] = {}
        top = ""
        if involved is not None:
            labels = dict(involved["metadata"].get("labels") or {})
            top = self._top_owner(involved)
        entry = LedgerEntry(uid=created["metadata"]["uid"], api="events.k8s.io/v1" if new_api else "v1",
                            namespace=ns, name=ev_name, reason=reason, type=etype, involved_kind=kind,
                            involved_uid=uid, existed=involved is not None, labels=labels, owner_top=top)
        self.ledger.append(entry)
        if self._ledger_file is not None:
            self._ledger_file.write(orjson.dumps(entry) + b"\n")
            self._ledger_file.flush()
        if len(self._events) > self.max_events:
            self._expire()

    def _top_owner(self, obj: dict[str, Any]) -> str:
        top = ""
        current = obj
        for _ in range(4):
            refs = [r for r in current["metadata"].get("ownerReferences") or () if r.get("controller")]
            if not refs:
                break
            ref = refs[0]
            top = f"{ref['kind']}/{ref['name']}"
            resource = {"ReplicaSet": "replicasets.apps", "Deployment": "deployments.apps"}.get(ref["kind"])
            if resource is None:
                break
            try:
                current = self.store.get_raw(self.store.resolve(resource), ref["name"],
                                             current["metadata"]["namespace"])
            except SimStatusError:
                break
        return top

    def _expire(self) -> None:
        resource, ns, name = self._events.pop(0)
        self._event_about.pop((resource, ns, name), None)
        try:
            self.store.delete(resource, name, namespace=ns, copy=False)
            self.stats.expired += 1
        except SimStatusError:
            pass

    def _bump(self) -> None:
        # Recent Events repeat most; an Event about an object that is gone no longer repeats (the
        # condition it reports ended with the object).
        for _ in range(8):
            idx = min(len(self._events) - 1, int(len(self._events) * (1 - self._rng.random() ** 3)))
            resource, ns, name = self._events[idx]
            if self._event_about.get((resource, ns, name)) not in self._gone_uids:
                break
        else:
            self._about_pod()
            return
        try:
            current = self.store.get_raw(self.store.resolve(resource), name, ns)
        except SimStatusError:
            return
        wall = self._clock.wall()
        new = dict(current)
        if resource == "events":
            new["count"] = int(current.get("count") or 1) + 1
            new["lastTimestamp"] = _now(wall)
        else:
            series = dict(current.get("series") or {"count": 1})
            series["count"] = int(series.get("count") or 1) + 1
            series["lastObservedTime"] = _micro(wall)
            new["series"] = series
        self.store.update(resource, new, namespace=ns, copy=False)
        self.stats.bumped += 1
        if self._ledger_file is not None:  # the time is read before the repetition can be watched
            count = new["count"] if resource == "events" else new["series"]["count"]
            self._ledger_file.write(orjson.dumps({"bumped": current["metadata"]["uid"], "count": count,
                                                  "at": wall}) + b"\n")

    def _about_pod(self) -> None:
        ns, name = self._rng.choice(self._pods)
        pod = self.store.get_raw(self.store.resolve("pods"), name, ns)
        self._new_event(pod, kind="Pod", api_version="v1", ns=ns, name=name, uid=pod["metadata"]["uid"])

    def _about_controller(self) -> None:
        kind, api_version, ns, name = self._rng.choice(self._controllers)
        resource = "deployments.apps" if kind == "Deployment" else "replicasets.apps"
        obj = self.store.get_raw(self.store.resolve(resource), name, ns)
        self._new_event(obj, kind=kind, api_version=api_version, ns=ns, name=name, uid=obj["metadata"]["uid"],
                        warning=False,
                        reason="ScalingReplicaSet" if kind == "Deployment" else "SuccessfulCreate")

    def _about_gone(self) -> None:
        ns, name, uid = self._rng.choice(self._gone)
        self._new_event(None, kind="Pod", api_version="v1", ns=ns, name=name, uid=uid, reason="FailedKillPod",
                        warning=True)
        self.stats.about_gone += 1

    def _lifecycle(self) -> None:
        """A Pod killed (an Event about it first), deleted, and re-created under its name."""
        key = self._rng.choice(self._pods)
        ns, name = key
        pod = self.store.get_raw(self.store.resolve("pods"), name, ns)
        uid = pod["metadata"]["uid"]
        self._new_event(pod, kind="Pod", api_version="v1", ns=ns, name=name, uid=uid, reason="Killing",
                        warning=False)
        self.store.delete("pods", name, namespace=ns, copy=False)
        self.stats.pods_deleted += 1
        self.deleted.append((uid, self._clock.wall()))
        if self._ledger_file is not None:
            self._ledger_file.write(orjson.dumps({"deleted_pod": uid, "at": self._clock.wall()}) + b"\n")
        self._gone.append((ns, name, uid))
        self._gone_uids.add(uid)
        if len(self._gone) > 1000:
            self._gone.pop(0)
        rs_name, rs_uid, app = self._pod_template.pop(key)
        self._drop_pod(key)
        again = self._make_pod(ns, name, rs_name, rs_uid, app)
        self.stats.pods_recreated += 1
        self._new_event(again, kind="Pod", api_version="v1", ns=ns, name=name, uid=again["metadata"]["uid"],
                        reason="Scheduled", warning=False)

    def step(self) -> None:
        """One Event change (or a lifecycle: a few)."""
        roll = self._rng.random()
        if not self._events or roll < self.new_share:
            pick = self._rng.random()
            if self._gone and pick < self.gone_share:
                self._about_gone()
            elif pick < self.gone_share + 0.05:
                self._about_controller()
            else:
                self._about_pod()
        elif roll < self.new_share + self.lifecycle_share and self._pods:
            self._lifecycle()
        else:
            self._bump()

    def stop(self) -> None:
        self._stopped = True

    def _rate_at(self, elapsed: float) -> float:
        if self.burst_every > 0 and elapsed % self.burst_every < self.burst_length:
            return self.rate * self.burst_factor
        return self.rate

    async def run(self, duration: float | None = None, max_changes: int | None = None) -> EventStats:
        """Makes Event changes at the rate (bursts included) until ``duration`` or ``max_changes``
        or :meth:`stop`."""
        self._stopped = False
        clock = self._clock
        start = last = clock.now()
        owed = 1.0
        while not self._stopped:
            now = clock.now()
            elapsed = now - start
            if duration is not None and elapsed >= duration:
                break
            if max_changes is not None and self.stats.changes >= max_changes:
                break
            owed += (now - last) * self._rate_at(elapsed)
            last = now
            due = min(math.floor(owed), _MAX_BATCH)
            owed -= due
            for _ in range(due):
                self.step()
            if due < _MAX_BATCH:
                await clock.sleep(0.01)
            else:
                await asyncio.sleep(0)
        if self._ledger_file is not None:
            self._ledger_file.flush()
        return self.stats

    def close(self) -> None:
        if self._ledger_file is not None:
            self._ledger_file.close()
            self._ledger_file = None
