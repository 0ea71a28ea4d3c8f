"""The reconciliation check behind ``kube-event-bridge verify``: what a sink holds against the cluster.

An audit team that runs this after an incident (and the fault-schedule tests, which use it as their
oracle) wants one answer: does replaying what the sink holds give the cluster's current state? The
check takes the CloudEvents read back from a sink, in the sink's own order (file lines, a Kafka
partition's offsets, a JetStream stream's sequence), and the objects a list of the cluster returns,
and reports per watched resource:

* **missing**: objects the cluster has that are not alive in the sink;
* **phantom**: objects alive in the sink that the cluster no longer has (a delete never arrived);
* **stale**: objects alive in both whose newest state in the sink is older than the cluster's;
* **altered**: objects alive in both at the cluster's resourceVersion, whose state in the sink holds
  a value that is not the cluster's (a number rounded, a string cut: :mod:`bridge.service.verify_values`
  compares them exactly);
* **duplicate ids**: events stored more than once (expected under at-least-once after a crash);
* **order violations**: a change of an object older than one the sink already held for it, that is
  not a redelivery of an event it already held (per-object order is part of the contract);
* **gap markers**: the windows in which the bridge says intermediate changes were not observed.

Missing, phantom, stale and altered objects make the sink's state differ from the cluster's; order violations
fail the check too (``strict``, the default), duplicates and gaps are reported.

The state is the one a consumer ends with that follows docs/delivery-contract.md's advice: it drops
an event whose id it has already seen and applies every other as it comes, comparing no
resourceVersions. An object is identified by its uid (a uid lives once: re-creating a name gives a
new uid, and a uid is deleted once). In the sink's order, per uid, an event not seen before:
``added``, ``updated`` and ``sync`` make the object alive at that state (an older state too: the
consumer then ends stale); ``deleted`` ends it whatever its resourceVersion (a delete inferred by a
relist, ``finalstateunknown``, carries the last state the bridge knew). A redelivered event (same id)
is therefore harmless, and a change sent after its object's delete, followed by that delete again
(same id, dropped), leaves the consumer with a phantom. Order violations are changes older than the
state held, a delete older than the state it ends (unless inferred), a second delete of one uid, and
a new change after a delete. Snapshot
markers are counted; a snapshot is not used to drop objects it does not contain, so a delete the sink
never received shows as a phantom even when a later snapshot left the object out.

Payload modes: ``object`` (data is the object), ``object_and_old`` (data is ``{"object",
"oldObject"}``) and ``merge_patch`` (an update's data is an RFC 7386 patch applied to the previous
state) are rebuilt into the object; the object's uid and resourceVersion must agree with the event's
attributes. A change event whose data is none of these is refused (:class:`UnreconstructableError`):
the verifier cannot say what the sink's state is.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.errors import ConfigurationError
from bridge.service.verify_values import first_difference

__all__ = [
    "ClusterObject",
    "ResourceReport",
    "ResourceScope",
    "SinkEvent",
    "UnreconstructableError",
    "VerifyReport",
    "merge_patch",
    "verify",
]

NATIVE_PREFIX = "io.kube-event-bridge."
KNATIVE_PREFIX = "dev.knative.apiserver.resource."
_KNATIVE_TYPES = {"add": "added", "update": "updated", "delete": "deleted"}
MERGE_PATCH = "application/merge-patch+json"
EXAMPLES = 20
"""Objects listed per kind of discrepancy in a report (the counts are always complete)."""


class UnreconstructableError(ConfigurationError):
    """A sink holds events the verifier cannot rebuild the state from (unknown payload shape)."""


class Change(enum.StrEnum):
    ADDED = "added"
    UPDATED = "updated"
    DELETED = "deleted"
    SYNC = "sync"


@dataclass(frozen=True, slots=True)
class SinkEvent:
    """One CloudEvent as read back from a sink, with where it was found (for the report)."""

    ce: Mapping[str, Any]
    position: str
    """``file:LINE``, ``topic/partition@offset``, ``stream#seq``."""


@dataclass(frozen=True, slots=True)
class ClusterObject:
    uid: str
    key: str
    """``namespace/name`` or ``name``."""
    resource_version: str
    obj: Mapping[str, Any] | None = field(default=None, compare=False)
    """The object as listed, decoded exactly (:func:`bridge.service.verify_values.decode`), with the
    ``apiVersion`` and ``kind`` of its resource; None: only its identity is known, and the values a
    sink holds of it are not compared."""


@dataclass(frozen=True, slots=True)
class ResourceScope:
    """What one verified resource covers: its events are those whose ``apiversion`` and ``kind``
    match (and ``namespace``, when the resource is watched in one namespace)."""

    name: str
    """As written under ``resources:`` or on the command line (``pods``, ``deployments.apps``)."""
    api_version: str
    kind: str
    namespace: str = ""

    def label(self) -> str:
        return f"{self.name} ({self.namespace})" if self.namespace else self.name

    def matches(self, ce: Mapping[str, Any]) -> bool:
        if ce.get("apiversion") != self.api_version or ce.get("kind") != self.kind:
            return False
        return not self.namespace or not _is_change(ce) or ce.get("namespace") == self.namespace


@dataclass(slots=True)
class _State:
    key: str
    rv: str
    alive: bool
    obj: Any
    """The rebuilt object (None when the events carried none)."""
    deleted_at: str = ""


@dataclass(slots=True)
class ResourceReport:
    """The verdict for one resource."""

    resource: str
    cluster_objects: int = 0
    sink_objects: int = 0
    """Objects alive in the sink's reconstructed state."""
    events: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    missing: list[dict[str, str]] = field(default_factory=list)
    phantom: list[dict[str, str]] = field(default_factory=list)
    stale: list[dict[str, str]] = field(default_factory=list)
    altered: list[dict[str, str]] = field(default_factory=list)
    duplicate_ids: int = 0
    """Events stored again under an id already seen (each extra copy counts once)."""
    duplicate_examples: list[dict[str, Any]] = field(default_factory=list)
    order_violations: list[dict[str, str]] = field(default_factory=list)
    gap_markers: list[dict[str, Any]] = field(default_factory=list)
    snapshots: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    """Complete counts of missing, phantom, stale, altered and order violations (the lists are cut)."""

    @property
    def gaps(self) -> int:
        """Relist windows announced (``gap.begin`` markers)."""
        return sum(1 for g in self.gap_markers if g["type"] == "gap.begin")

    @property
    def consistent(self) -> bool:
        return not any(self.counts.get(k) for k in ("missing", "phantom", "stale", "altered"))

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource, "consistent": self.consistent,
            "cluster_objects": self.cluster_objects, "sink_objects": self.sink_objects,
            "events": self.events, "changes": self.changes,
            "missing": self.counts.get("missing", 0), "phantom": self.counts.get("phantom", 0),
            "stale": self.counts.get("stale", 0), "altered": self.counts.get("altered", 0),
            "duplicate_ids": self.duplicate_ids,
            "order_violations": self.counts.get("order_violations", 0),
            "gaps": self.gaps, "snapshots": self.snapshots,
            "examples": {"missing": self.missing, "phantom": self.phantom, "stale": self.stale,
                         "altered": self.altered, "duplicate_ids": self.duplicate_examples,
                         "order_violations": self.order_violations},
            "gap_markers": self.gap_markers,
        }


@dataclass(slots=True)
class VerifyReport:
    """Every resource's verdict, plus what the sink held that no verified resource covers."""

    sink: str
    resources: list[ResourceReport]
    undecodable: int = 0
    """Records that were not a CloudEvent at all (a torn line, a foreign message)."""
    undecodable_examples: list[str] = field(default_factory=list)
    other_events: int = 0
    """Events of resources (or clusters) not being verified."""
    strict: bool = True
    """Per-object order violations fail the check (the default)."""

    @property
    def consistent(self) -> bool:
        return all(r.consistent for r in self.resources)

    @property
    def ok(self) -> bool:
        if not self.consistent:
            return False
        return not (self.strict and any(r.counts.get("order_violations") for r in self.resources))

    def to_json(self) -> dict[str, Any]:
        return {"sink": self.sink, "consistent": self.consistent, "ok": self.ok, "strict": self.strict,
                "undecodable": self.undecodable, "undecodable_examples": self.undecodable_examples,
                "other_events": self.other_events, "resources": [r.to_json() for r in self.resources]}

    def render(self) -> str:
        """The human-readable table."""
        head = ("resource", "cluster", "sink", "events", "missing", "phantom", "stale", "altered",
                "dup ids", "order", "gaps", "verdict")
        rows = [head]
        for r in self.resources:
            c = r.counts
            rows.append((r.resource, str(r.cluster_objects), str(r.sink_objects), str(r.events),
                         str(c.get("missing", 0)), str(c.get("phantom", 0)), str(c.get("stale", 0)),
                         str(c.get("altered", 0)), str(r.duplicate_ids), str(c.get("order_violations", 0)),
                         str(r.gaps),
                         "ok" if r.consistent else "MISMATCH"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
        lines = [f"sink: {self.sink}", ""]
        for i, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j])
                                   for j, cell in enumerate(row)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        for r in self.resources:
            lines.extend(_details(r))
        if self.undecodable:
            lines.append(f"\n{self.undecodable} record(s) were not CloudEvents (torn or foreign), e.g. "
                         + ", ".join(self.undecodable_examples[:3]))
        if self.other_events:
            lines.append(f"\n{self.other_events} event(s) of other resources or clusters were not checked")
        verdict = ("the sink's state equals the cluster's" if self.consistent
                   else "the sink's state differs from the cluster's")
        if self.consistent and not self.ok:
            verdict += ", but the sink broke per-object order"
        lines.append(f"\nverdict: {verdict}")
        return "\n".join(lines) + "\n"


def _details(r: ResourceReport) -> list[str]:
    out: list[str] = []

    def section(title: str, total: int, items: Sequence[Mapping[str, Any]]) -> None:
        if not total:
            return
        out.append(f"\n{r.resource}: {total} {title}")
        for item in items:
            out.append("  " + "  ".join(f"{k}={v}" for k, v in item.items()))
        if total > len(items):
            out.append(f"  … and {total - len(items)} more")

    section("missing from the sink", r.counts.get("missing", 0), r.missing)
    section("phantom (alive in the sink, gone from the cluster)", r.counts.get("phantom", 0), r.phantom)
    section("stale (older than the cluster)", r.counts.get("stale", 0), r.stale)
    section("altered (a value differs from the cluster's at its resourceVersion)", r.counts.get("altered", 0),
            r.altered)
    section("per-object order violation(s)", r.counts.get("order_violations", 0), r.order_violations)
    section("event id(s) stored more than once", r.duplicate_ids, r.duplicate_examples)
    section("gap marker(s)", len(r.gap_markers), r.gap_markers[:EXAMPLES])
    return out


# --------------------------------------------------------------------------------------------------
# reading one event


def event_kind(ce: Mapping[str, Any]) -> str:
    """``added`` … ``snapshot.begin``, ``gap.begin``: the type without its prefix (Knative types
    mapped to the native ones); "" when the type is not the bridge's."""
    t = str(ce.get("type") or "")
    if t.startswith(NATIVE_PREFIX):
        return t[len(NATIVE_PREFIX):]
    if t.startswith(KNATIVE_PREFIX):
        return _KNATIVE_TYPES.get(t[len(KNATIVE_PREFIX):], "")
    return ""


def _is_change(ce: Mapping[str, Any]) -> bool:
    return event_kind(ce) in Change.__members__.values()


def _rv_int(rv: str) -> int | None:
    try:
        return int(rv)
    except ValueError:
        return None


def _older(rv: str, than: str) -> bool:
    a, b = _rv_int(rv), _rv_int(than)
    return a is not None and b is not None and a < b


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: a mapping patches a mapping member by member (``null`` removes), anything else
    replaces the target."""
    if not isinstance(patch, Mapping):
        return patch
    out: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _rebuild(ce: Mapping[str, Any], kind: str, previous: Any, position: str) -> Any:
    """The object an event carries, per payload mode."""
    data = ce.get("data")
    if kind == Change.UPDATED and ce.get("datacontenttype") == MERGE_PATCH:
        if previous is None:
            raise UnreconstructableError(
                f"event {ce.get('id')} at {position} is a merge patch for {ce.get('subject')} but the sink "
                "holds no earlier state of that object to apply it to (payload mode merge_patch needs "
                "the object's added or sync event first)")
        return merge_patch(previous, data)
    if isinstance(data, Mapping) and set(data) == {"object", "oldObject"}:
        data = data["object"]
    if not isinstance(data, Mapping) or not isinstance(data.get("metadata"), Mapping):
        raise UnreconstructableError(
            f"event {ce.get('id')} at {position} ({kind} of {ce.get('subject')}) carries data the verifier "
            "cannot rebuild an object from; supported payload modes: object, object_and_old, merge_patch")
    return data


# --------------------------------------------------------------------------------------------------
# the check


def verify(*, sink: str, events: Iterable[SinkEvent],
           cluster: Mapping[ResourceScope, Sequence[ClusterObject]], cluster_name: str | None = None,
           undecodable: Sequence[str] = (), strict: bool = True) -> VerifyReport:
    """Compares the sink's events (in the sink's order) with the cluster's objects per resource.

    ``cluster_name`` keeps only events whose ``cluster`` attribute is that name. ``undecodable`` names
    the positions of records that were not CloudEvents. Raises :class:`UnreconstructableError` when an
    event's payload cannot be rebuilt. ``strict`` False reports per-object order violations
    without failing the check on them.
    """
    scopes = list(cluster)
    per_scope: dict[ResourceScope, list[SinkEvent]] = {s: [] for s in scopes}
    other = 0
    for ev in events:
        if cluster_name is not None and ev.ce.get("cluster") != cluster_name:
            other += 1
            continue
        scope = next((s for s in scopes if s.matches(ev.ce)), None)
        if scope is None:
            other += 1
        else:
            per_scope[scope].append(ev)
    reports = [_check(scope, per_scope[scope], cluster[scope]) for scope in scopes]
    return VerifyReport(sink=sink, resources=reports, undecodable=len(undecodable),
                        undecodable_examples=list(undecodable[:EXAMPLES]), other_events=other, strict=strict)


def _check(scope: ResourceScope, events: Sequence[SinkEvent],
           objects: Sequence[ClusterObject]) -> ResourceReport:
    report = ResourceReport(resource=scope.label(), cluster_objects=len(objects), events=len(events))
    states: dict[str, _State] = {}
    seen_ids: collections.Counter[str] = collections.Counter()
    changes: collections.Counter[str] = collections.Counter()
    violations: list[dict[str, str]] = []
    for ev in events:
        ce = ev.ce
        kind = event_kind(ce)
        ident = str(ce.get("id") or "")
        repeat = bool(ident) and seen_ids[ident] > 0
        if ident:
            seen_ids[ident] += 1
        if kind.startswith("snapshot."):
            report.snapshots += kind == "snapshot.begin"
            continue
        if kind.startswith("gap."):
            report.gap_markers.append({"type": kind, "position": ev.position,
                                       **{k: v for k, v in ce.items() if k not in _ENVELOPE}})
            continue
        if kind not in Change.__members__.values():
            continue
        changes[kind] += 1
        uid = str(ce.get("uid") or "")
        rv = str(ce.get("resourceversion") or "")
        key = str(ce.get("subject") or "")
        if not uid or not rv:
            raise UnreconstructableError(
                f"event {ident} at {ev.position} has no uid or resourceversion attribute; the verifier "
                "identifies objects by them (see docs/event-format.md)")
        state = states.get(uid)
        obj = _rebuild(ce, kind, state.obj if state is not None else None, ev.position)
        meta = obj.get("metadata") or {}
        if str(meta.get("uid") or uid) != uid or str(meta.get("resourceVersion") or rv) != rv:
            raise UnreconstructableError(
                f"event {ident} at {ev.position}: its data (uid {meta.get('uid')}, resourceVersion "
                f"{meta.get('resourceVersion')}) disagrees with its attributes (uid {uid}, "
                f"resourceversion {rv})")
        deleting = kind == Change.DELETED
        if state is not None:
            problem = _order_problem(state, deleting=deleting, rv=rv, ce=ce)
            if problem and not repeat:
                violations.append({"object": key, "uid": uid, "event": kind, "resourceversion": rv,
                                   "after": f"{'deleted' if not state.alive else 'state'}@{state.rv}",
                                   "problem": problem, "position": ev.position})
        # The consumer the docs recommend drops an event whose id it has seen and applies any other
        # as it comes, comparing no resourceVersions: a change brings the object to its state (an
        # older one too, or one after the uid's delete), a delete ends it. What it ends with is
        # what the sink's state is judged by.
        if repeat:
            continue
        states[uid] = _State(key=key, rv=rv, alive=not deleting, obj=obj)
    report.changes = dict(changes)
    report.duplicate_ids = sum(n - 1 for n in seen_ids.values() if n > 1)
    report.duplicate_examples = [{"id": i, "copies": n} for i, n in seen_ids.most_common(EXAMPLES) if n > 1]
    _compare(report, {uid: s for uid, s in states.items() if s.alive}, objects, violations)
    return report


def _order_problem(state: _State, *, deleting: bool, rv: str, ce: Mapping[str, Any]) -> str:
    """What is wrong with a change (or a delete) of resourceVersion ``rv`` coming after ``state``
    of its uid, "" if nothing."""
    if deleting and not state.alive:
        return "a second delete of one uid"  # a uid is deleted once: the first one ended it
    if deleting and _older(rv, state.rv) and ce.get("finalstateunknown") != "true":
        return "a delete older than the state it ends"
    if not deleting and not state.alive:
        return "a change after the delete of its uid"
    if not deleting and _older(rv, state.rv):
        return "older than the state already held"
    return ""


def _compare(report: ResourceReport, alive: dict[str, _State], objects: Sequence[ClusterObject],
             violations: list[dict[str, str]]) -> None:
    """The sink's live objects (``alive``, by uid) against the cluster's: missing, phantom, stale and
    altered objects, with the order violations found, counted and exemplified in ``report``."""
    report.sink_objects = len(alive)
    in_cluster = {o.uid: o for o in objects}
    missing = [{"object": o.key, "uid": o.uid, "cluster_rv": o.resource_version}
               for o in sorted(objects, key=lambda o: o.key) if o.uid not in alive]
    phantom = [{"object": s.key, "uid": uid, "sink_rv": s.rv}
               for uid, s in sorted(alive.items(), key=lambda i: i[1].key) if uid not in in_cluster]
    stale = [{"object": s.key, "uid": uid, "sink_rv": s.rv, "cluster_rv": in_cluster[uid].resource_version}
             for uid, s in sorted(alive.items(), key=lambda i: i[1].key)
             if uid in in_cluster and s.rv != in_cluster[uid].resource_version]
    altered = _altered(alive, in_cluster)
    report.counts = {"missing": len(missing), "phantom": len(phantom), "stale": len(stale),
                     "altered": len(altered), "order_violations": len(violations)}
    report.missing, report.phantom, report.stale = missing[:EXAMPLES], phantom[:EXAMPLES], stale[:EXAMPLES]
    report.altered = altered[:EXAMPLES]
    report.order_violations = violations[:EXAMPLES]


def _altered(alive: dict[str, _State], in_cluster: Mapping[str, ClusterObject]) -> list[dict[str, str]]:
    """The objects alive in both at the cluster's resourceVersion whose state in the sink holds a
    value that is not the cluster's: where (the path), never what (the values may be a Secret's)."""
    out: list[dict[str, str]] = []
    for uid, s in sorted(alive.items(), key=lambda i: i[1].key):
        listed = in_cluster.get(uid)
        if listed is None or listed.obj is None or s.rv != listed.resource_version \
                or not isinstance(s.obj, Mapping):
            continue
        found = first_difference(s.obj, listed.obj)
        if found is not None:
            out.append({"object": s.key, "uid": uid, "resourceversion": s.rv, "path": found[0],
                        "difference": found[1]})
    return out


_ENVELOPE = frozenset({"specversion", "id", "source", "type", "time", "datacontenttype", "data",
                       "apiversion", "kind"})
