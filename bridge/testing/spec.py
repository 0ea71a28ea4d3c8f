"""An executable specification of the delivery contract (docs/delivery-contract.md): a small, pure
model that reads what happened and says what broke the contract.

The system under test (the bridge, in process or as a process) is not consulted: the model is a
checker in the manner of Jepsen's, fed three records —

* the cluster's **history**: the objects at the origin (what the first list reflects) and every
  change after it, in the server's order (:class:`Change`: created, updated, deleted; a name may be
  re-used by a new uid);
* the **faults** that justify a relist (:class:`History.relist_causes`: the resourceVersions at which
  the server's history was compacted or a watch was answered 410);
* per sink, what it **received**, in order, with its acknowledgements, the checkpoint writes that
  made them durable and the crashes (:class:`SinkLog`).

From those it derives what each sink MUST have received (every change after the origin as its own
event, unless an announced gap window that sink received covers it; a delete for every object it was
told exists and that is gone) and what it MAY have received (real states of real objects, in
per-object order, a delete only of a uid that was deleted, a repeat only of an event not yet durably
acknowledged when the bridge crashed), and it folds the sink's events the way a consumer that drops
repeated CloudEvents ids does (:func:`dedup_consume`), comparing that consumer's end state with the
cluster's (missing, phantom and stale objects).

Identity follows docs/event-format.md: a change event's id is a function of (type, uid,
resourceVersion); a delete's of the uid alone (a uid is deleted once); a gap marker's of its gap id.
The model never compares wall-clock times: what it judges is order and content.

Findings are plain records (:class:`Finding`) so a failing check prints what to look at; the kinds are
listed in :data:`FINDING_KINDS`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "FINDING_KINDS",
    "Acked",
    "Change",
    "ChangeKind",
    "Checkpointed",
    "ConsumerState",
    "Crashed",
    "Entry",
    "Finding",
    "History",
    "Received",
    "SinkLog",
    "by_kind",
    "check_sink",
    "dedup_consume",
    "scope_of",
]


class ChangeKind(enum.StrEnum):
    """What the API server did (the watch's ADDED / MODIFIED / DELETED)."""

    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Change:
    """One change the API server made: ``rv`` is its resourceVersion (the server's order)."""

    rv: int
    kind: ChangeKind
    key: str
    """``namespace/name`` or ``name``."""
    uid: str


@dataclass(slots=True)
class History:
    """The cluster's history as the model needs it.

    ``origin`` is the state the bridge's first list reflects (key → (uid, rv)), ``origin_rv`` its
    resourceVersion; ``changes`` every change after it, in order; ``relist_causes`` the
    resourceVersions at which a relist became legitimate (a compaction of the server's history, a
    410 sent into a watch): a gap window announced without one inside it (or inside a window that
    had one) is needless — section 4 promises every change while the history is available.
    """

    origin: dict[str, tuple[str, int]] = field(default_factory=dict)
    origin_rv: int = 0
    changes: list[Change] = field(default_factory=list)
    relist_causes: list[int] = field(default_factory=list)
    relists: list[tuple[int, int]] | None = None
    """When known (a driver that sees every relist window the bridge hands a sink, whether or not
    the destination received it): each relist's window (from, to], what it coalesced. The window a
    restart frames around a relist's state of one object (``…:relisted:<uid>:…``) re-announces what
    relists coalesced, so it covers only the changes inside one of the relist windows it overlaps:
    one the watch showed one by one (between two relists) is owed as its own event
    (docs/delivery-contract.md, section 2). (A replayed delete's window, ``…:replayed:<uid>:…``,
    covers what it names: section 6 holds back every replayed change after the relist's start.)
    None, or no relist window overlapping it: it covers what it names."""

    def coalesced(self, begin: int, end: int, rv: int) -> bool:
        """Whether the change at ``rv`` inside the per-object window (begin, end] lies inside a
        relist window that overlaps it (True when none is known to)."""
        overlapping = [(lo, hi) for lo, hi in self.relists or () if lo < end and begin < hi]
        return not overlapping or any(lo < rv <= hi for lo, hi in overlapping)

    def states(self) -> dict[str, set[int]]:
        """uid → the resourceVersions at which the uid had a state (origin, creation, updates)."""
        out: dict[str, set[int]] = {}
        for uid, rv in self.origin.values():
            out.setdefault(uid, set()).add(rv)
        for c in self.changes:
            if c.kind is not ChangeKind.DELETED:
                out.setdefault(c.uid, set()).add(c.rv)
        return out

    def deleted(self) -> dict[str, int]:
        """uid → the resourceVersion of its delete."""
        return {c.uid: c.rv for c in self.changes if c.kind is ChangeKind.DELETED}

    def final(self) -> dict[str, tuple[str, int]]:
        """uid → (key, resourceVersion) of every object alive at the end."""
        alive = {uid: (key, rv) for key, (uid, rv) in self.origin.items()}
        for c in self.changes:
            if c.kind is ChangeKind.DELETED:
                alive.pop(c.uid, None)
            else:
                alive[c.uid] = (c.key, c.rv)
        return alive


class Marker(enum.StrEnum):
    GAP_BEGIN = "gap.begin"
    GAP_END = "gap.end"


@dataclass(frozen=True, slots=True)
class Received:
    """One event a sink received, as a consumer reads it.

    ``kind``: ``added``, ``updated``, ``deleted``, ``gap.begin`` or ``gap.end``. Change events carry
    ``key``, ``uid``, ``rv`` and, inside a gap, ``gap_id``; ``inferred`` marks a delete a relist
    inferred (``finalstateunknown``). Gap markers carry ``gap_id``, ``gap_from`` and (on the end)
    ``gap_to``; ``scope_uid`` is set when the window concerns one object only (the per-object
    windows a restart frames: gap ids ``…:relisted:<uid>:…`` and ``…:replayed:<uid>:…``).
    """

    kind: str
    key: str = ""
    uid: str = ""
    rv: int = 0
    inferred: bool = False
    gap_id: str = ""
    gap_from: int = 0
    gap_to: int = 0
    scope_uid: str = ""

    @property
    def is_change(self) -> bool:
        return self.kind in ("added", "updated", "deleted")

    @property
    def ident(self) -> tuple[str, ...]:
        """What the CloudEvents id is a function of (docs/event-format.md)."""
        if self.kind == "deleted":
            return ("deleted", self.uid)
        if self.is_change:
            return (self.kind, self.uid, str(self.rv))
        return (self.kind, self.gap_id)


OVERFLOW = "overflow:"
"""How the gap id of a sink's own window begins (a listener that degraded)."""


def scope_of(gap_id: str) -> str:
    """The uid a gap id frames alone (docs/event-format.md: ``<informer>:relisted:<uid>:…``,
    ``<informer>:replayed:<uid>:…`` and ``<informer>:overflowed:<uid>:…``), "" for a relist's window
    over every object."""
    for tag in (":relisted:", ":replayed:", ":overflowed:"):
        if tag in gap_id:
            return gap_id.split(tag, 1)[1].split(":", 1)[0]
    return ""


@dataclass(frozen=True, slots=True)
class Acked:
    """The sink acknowledged the event at ``index`` of its log (the index of a :class:`Received`);
    ``dead_lettered``: by setting it aside in its dead-letter destination (read back with the sink:
    the event counts as received either way, docs/delivery-contract.md, section 1)."""

    index: int
    dead_lettered: bool = False


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A checkpoint write completed: what the sink acknowledged before it is durable."""


@dataclass(frozen=True, slots=True)
class Crashed:
    """The bridge crashed (nothing drained); what follows comes from a restarted bridge."""


Entry = Received | Acked | Checkpointed | Crashed


@dataclass(slots=True)
class SinkLog:
    """One sink's log, in order: events received, acknowledgements, checkpoint writes, crashes."""

    name: str
    entries: list[Entry] = field(default_factory=list)

    def received(self) -> list[Received]:
        return [e for e in self.entries if isinstance(e, Received)]


FINDING_KINDS = {
    "lost": "a change after the origin the sink never received, outside every gap window it was told of",
    "invented": "an event of a state, or a delete, the cluster never had",
    "order": "a new event (not a repeated id) of an object older than one the sink already held, or "
             "after its delete",
    "needless_gap": "a gap window announced while the server still had the history (no compaction or "
                    "410 inside it), other than a sink's own overflow window",
    "excess_repeat": "an event repeated after a crash although the sink's acknowledgement of it was "
                     "durable (a checkpoint written after the acknowledgement)",
    "unclosed_gap": "a gap.begin without its gap.end (and no crash after it), or a gap.end without its "
                    "begin",
    "missing": "the deduplicating consumer lacks an object the cluster has",
    "phantom": "the deduplicating consumer holds an object the cluster no longer has",
    "stale": "the deduplicating consumer holds an object at an older state than the cluster's",
}


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    sink: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.sink}] {self.kind}: {self.detail}"


@dataclass(slots=True)
class ConsumerState:
    """What a consumer that drops repeated ids holds: uid → (key, rv), and the ids it has seen."""

    objects: dict[str, tuple[str, int]] = field(default_factory=dict)
    seen: set[tuple[str, ...]] = field(default_factory=set)


def dedup_consume(events: Iterable[Received], state: ConsumerState | None = None) -> ConsumerState:
    """Folds ``events`` as the consumer docs/delivery-contract.md recommends: an event whose id was
    seen is dropped; any other is applied as it comes — ``added``/``updated`` set the object's state,
    ``deleted`` removes it. The consumer trusts the stream's order: it compares no resourceVersions,
    so an out-of-order change shows in what it ends with."""
    state = state or ConsumerState()
    for e in events:
        if not e.is_change:
            continue
        if e.ident in state.seen:
            continue
        state.seen.add(e.ident)
        if e.kind == "deleted":
            state.objects.pop(e.uid, None)
        else:
            state.objects[e.uid] = (e.key, e.rv)
    return state


@dataclass(frozen=True, slots=True)
class _Window:
    begin: int
    end: int
    uid: str
    """"" for a window over every object."""
    overflow: bool = False
    """A window of the sink's own (gap id ``overflow:<sink>:…``): its buffer and spill were full
    (docs/delivery-contract.md, section 7a), which needs no relist."""
    relisted: bool = False
    """A restart's window around a relist's state of one object (``…:relisted:<uid>:…``)."""

    def covers(self, change: Change) -> bool:
        return self.begin < change.rv <= self.end and (not self.uid or self.uid == change.uid)


def _windows(sink: str, events: Sequence[Received], findings: list[Finding],
             crashed_after: frozenset[str] = frozenset()) -> list[_Window]:
    """The gap windows the sink was told of: a ``gap.begin`` and the ``gap.end`` of the same id,
    paired by id rather than position (a Kafka topic read back partition by partition may hold a
    window's end before its begin). A begin whose end never came is a finding unless the bridge
    crashed after it (``crashed_after``: the ids of such begins; the restart frames its own
    window)."""
    begun: set[str] = set()
    ended: dict[str, Received] = {}
    for e in events:
        if e.kind == Marker.GAP_BEGIN:
            begun.add(e.gap_id)
        elif e.kind == Marker.GAP_END:
            ended.setdefault(e.gap_id, e)
    for gap_id in sorted(set(ended) - begun):
        findings.append(Finding("unclosed_gap", sink, f"gap.end {gap_id} without its begin"))
    for gap_id in sorted(begun - set(ended) - crashed_after):
        findings.append(Finding("unclosed_gap", sink, f"gap.begin {gap_id} never ended"))
    return [_Window(begin=e.gap_from, end=e.gap_to, uid=e.scope_uid, overflow=gap_id.startswith(OVERFLOW),
                    relisted=":relisted:" in gap_id)
            for gap_id, e in ended.items() if gap_id in begun]


def _begun_before_a_crash(entries: Sequence[Entry]) -> frozenset[str]:
    """The ids of the gap.begin markers a crash followed."""
    out: set[str] = set()
    pending: set[str] = set()
    for e in entries:
        if isinstance(e, Received) and e.kind == Marker.GAP_BEGIN:
            pending.add(e.gap_id)
        elif isinstance(e, Crashed):
            out |= pending
            pending = set()
    return frozenset(out)


def _justified(windows: Sequence[_Window], causes: Sequence[int]) -> tuple[set[_Window], list[_Window]]:
    """Splits windows into those a relist cause justifies (one lies inside it, or it starts inside
    a justified window: a restart's per-object window re-frames an earlier relist's) and the rest."""
    good = {w for w in windows if w.overflow or any(w.begin <= c <= w.end for c in causes)}
    changed = True
    while changed:
        changed = False
        for w in windows:
            if w not in good and any(g.begin <= w.begin <= g.end for g in good if not g.overflow):
                good.add(w)
                changed = True
    return good, [w for w in windows if w not in good]


def check_sink(history: History, log: SinkLog, *, all_windows: Sequence[Received] = (),
               check_end_state: bool = True) -> list[Finding]:
    """Every way ``log`` breaks the contract, given ``history``.

    ``all_windows``: gap markers any sink received (a per-object window re-framing a relist another
    sink had is justified by that relist). ``check_end_state`` False skips the consumer's end state
    (for a log taken before the bridge drained).
    """
    sink = log.name
    findings: list[Finding] = []
    events = log.received()
    windows = _windows(sink, events, findings, _begun_before_a_crash(log.entries))
    _check_content(history, sink, events, findings)
    _check_order(sink, events, findings)
    _check_lost(history, sink, events, windows, findings)
    every = _windows(sink, [*all_windows, *events], []) if all_windows else windows
    good, _ = _justified(every, history.relist_causes)
    # A restart re-frames what the sink's overflow window sent from that window's ``from``, also
    # when a crash came before the window's end reached the sink.
    overflowed = {e.gap_from for e in events if e.kind == Marker.GAP_BEGIN and e.gap_id.startswith(OVERFLOW)}
    for w in windows:
        if w not in good and not (w.uid and w.begin in overflowed):
            what = f"object {w.uid}" if w.uid else "every object"
            findings.append(Finding("needless_gap", sink, f"window ({w.begin}, {w.end}] over {what}, "
                                    f"relist causes at {sorted(history.relist_causes)}"))
    _check_repeats(sink, log.entries, findings)
    if check_end_state:
        _check_end_state(history, sink, events, findings)
    return findings


def _check_content(history: History, sink: str, events: Sequence[Received], findings: list[Finding]) -> None:
    states, deleted = history.states(), history.deleted()
    for e in events:
        if not e.is_change:
            continue
        if e.kind == "deleted":
            if e.uid not in deleted:
                findings.append(Finding("invented", sink, f"deleted {e.key} uid {e.uid} @{e.rv}: the uid "
                                        "was never deleted"))
            elif e.rv not in states.get(e.uid, set()) and e.rv != deleted[e.uid]:
                findings.append(Finding("invented", sink, f"deleted {e.key} uid {e.uid} @{e.rv}: no state "
                                        "of the uid had that resourceVersion"))
        elif e.rv not in states.get(e.uid, set()):
            findings.append(Finding("invented", sink, f"{e.kind} {e.key} uid {e.uid} @{e.rv}: no such "
                                    "state"))


def _check_order(sink: str, events: Sequence[Received], findings: list[Finding]) -> None:
    held: dict[str, int] = {}
    gone: dict[str, int] = {}
    seen: set[tuple[str, ...]] = set()
    for e in events:
        if not e.is_change:
            continue
        if e.ident in seen:
            continue
        seen.add(e.ident)
        if e.uid in gone:
            findings.append(Finding("order", sink, f"{e.kind} {e.key} uid {e.uid} @{e.rv} after its delete "
                                    f"@{gone[e.uid]}"))
            continue
        if e.kind == "deleted":
            gone[e.uid] = e.rv
            continue
        if e.rv < held.get(e.uid, 0):
            findings.append(Finding("order", sink,
                                    f"{e.kind} {e.key} uid {e.uid} @{e.rv} after @{held[e.uid]}"))
        held[e.uid] = max(held.get(e.uid, 0), e.rv)


def _check_lost(history: History, sink: str, events: Sequence[Received], windows: Sequence[_Window],
                findings: list[Finding]) -> None:
    got: set[tuple[str, int]] = set()
    deletes: set[str] = set()
    for e in events:
        if e.kind == "deleted":
            deletes.add(e.uid)
        elif e.is_change:
            got.add((e.uid, e.rv))
    for c in history.changes:
        if c.rv <= history.origin_rv:
            continue
        received = c.uid in deletes if c.kind is ChangeKind.DELETED else (c.uid, c.rv) in got
        if received or any(w.covers(c) and (not w.relisted or history.coalesced(w.begin, w.end, c.rv))
                           for w in windows):
            continue
        findings.append(Finding("lost", sink, f"{c.kind.value} {c.key} uid {c.uid} @{c.rv}"))


def _check_repeats(sink: str, entries: Sequence[Entry], findings: list[Finding]) -> None:
    """A repeat after a crash of an event whose acknowledgement a checkpoint made durable. Events
    inside a gap window are exempt: a restart re-frames a relist's states for every sink (section
    2), and a relist's differences are computed again. An event framed by a window of its own
    (a restart's per-object window) is one delivery with its markers: its acknowledgement counts
    once the window's end is acknowledged too."""
    log: list[Received] = []
    acked: set[tuple[str, ...]] = set()
    ends: set[str] = set()
    durable: set[tuple[str, ...]] = set()
    since_crash: set[tuple[str, ...]] = set()
    crashed = False
    for entry in entries:
        if isinstance(entry, Received):
            log.append(entry)
            if (crashed and entry.is_change and not entry.gap_id and entry.ident in durable
                    and entry.ident not in since_crash):
                findings.append(Finding("excess_repeat", sink, f"{entry.kind} {entry.key} uid {entry.uid} "
                                        f"@{entry.rv} again after a crash, acknowledged before a checkpoint"))
            since_crash.add(entry.ident)
        elif isinstance(entry, Acked):
            event = log[entry.index]
            if event.kind == Marker.GAP_END:
                ends.add(event.gap_id)
            acked.add(event.ident)
        elif isinstance(entry, Checkpointed):
            framed = {e.ident: e.gap_id for e in log if e.is_change and e.gap_id}
            durable |= {i for i in acked if i not in framed or framed[i] in ends}
        else:
            crashed = True
            since_crash = set()
            acked = set()
            ends = set()


def _check_end_state(history: History, sink: str, events: Sequence[Received],
                     findings: list[Finding]) -> None:
    held = dedup_consume(events).objects
    final = history.final()
    for uid, (key, rv) in sorted(final.items()):
        if uid not in held:
            findings.append(Finding("missing", sink, f"{key} uid {uid} @{rv}"))
        elif held[uid][1] != rv:
            findings.append(Finding("stale", sink, f"{key} uid {uid} @{held[uid][1]}, the cluster @{rv}"))
    for uid, (key, rv) in sorted(held.items()):
        if uid not in final:
            findings.append(Finding("phantom", sink, f"{key} uid {uid} @{rv}"))


def by_kind(findings: Iterable[Finding]) -> Mapping[str, int]:
    """Counts per finding kind (for a report)."""
    out: dict[str, int] = {}
    for f in findings:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out
