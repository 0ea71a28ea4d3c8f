"""The known-object journal: what sinks may have received, made durable before they receive it.

A checkpoint is written every ``checkpoint.interval``; between two writes the bridge keeps
delivering, so after a crash a relist could not report the delete of an object created since. The
journal keeps the contract's invariant (docs/delivery-contract.md, section 9):

    **Every object any sink may have received as existing is known after any crash**: it is in the
    last checkpoint written, or in this journal. And every delete any sink may have received is
    known the same way, with its resourceVersion and whether it was inferred.

The rule that keeps it, enforced by the sink listeners (they await :meth:`KnownObjectJournal.wait`):
the first event of an object the durable state does not know, every delete, and every state a relist
sends inside its gap (with the gap's ``from``, :attr:`Relisted.since`) is released only once its
record is durable; so is, for that sink alone, every state a degraded listener's overflow window
hands over (:class:`Overflowed`, the window's ``from``: the sink's listener awaits
:meth:`KnownObjectJournal.wait_recorded`). One writer task makes the pending records durable in one
write per batch (group commit); a backend with a size limit reports its :meth:`~JournalBackend.room`
and the records that do not fit wait for the compaction after the next checkpoint write, which drops
what that checkpoint implies. The records and their text: :mod:`bridge.delivery.journal_records`;
what a restart does with them: :mod:`bridge.delivery.resume_plan`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from bridge.clock import Clock, RealClock
from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind
from bridge.delivery.journal_records import (
    Deleted,
    Exists,
    JournalEntry,
    ListStart,
    Overflowed,
    Relisted,
    check_header,
    decode_line,
    encode_header,
    encode_record,
    encode_start,
)
from bridge.rawobject import object_identity
from bridge.resource_version import is_rv, rv_at_most
from bridge.storage.blobstore import JournalBackend
from bridge.storage.checkpoint import Checkpoint
from bridge.storage.fencing import BlobStoreError, CheckpointError, CheckpointStoreError
from sinks.contract import ChangeEvent, EventType, GapInfo

__all__ = [
    "Deleted",
    "Exists",
    "JournalBackend",
    "JournalEntry",
    "KnownObjectJournal",
    "ListStart",
    "Relisted",
]

log = logging.getLogger(__name__)

_RETRY_DELAY = 1.0
_WINDOW_TYPES = frozenset({EventType.ADDED, EventType.UPDATED, EventType.DELETED})
"""Seconds between attempts when the journal cannot be written (events wait meanwhile)."""


def _checkpoint_uids(cp: Checkpoint | None) -> dict[str, str]:
    """uid → key of the objects a checkpoint knows to exist (its index, updated by its ahead map)."""
    if cp is None:
        return {}
    alive = dict(cp.objects)
    for key, (uid, rv, deleted) in cp.ahead.items():
        if deleted:
            alive.pop(key, None)
        else:
            alive[key] = (uid, rv)
    return {uid: key for key, (uid, _) in alive.items()}


class KnownObjectJournal:
    """The journal of one informer (see the module docstring)."""

    def __init__(self, *, informer_id: str, backend: JournalBackend, clock: Clock | None = None) -> None:
        self._backend = backend
        self._clock: Clock = clock or RealClock()
        self._informer_id = informer_id
        self._entries: dict[str, JournalEntry] = {}
        """uid → newest fact, exactly what the file holds once the pending records are written."""
        self._checkpoint: dict[str, str] = {}
        """uid → key of the objects the last checkpoint written knows to exist."""
        self._base: Checkpoint | None = None
        """The last checkpoint written (or resumed from): what every sink acknowledged."""
        self._durable: dict[str, JournalEntry] = {}
        """uid → newest fact the stored journal holds (what a rewrite writes)."""
        self._overflowed: dict[tuple[str, str], Overflowed] = {}
        """(sink, uid) → the state that sink's overflow window handed over last (what the stored
        journal holds once the pending records are written)."""
        self._durable_overflowed: dict[tuple[str, str], Overflowed] = {}
        self._pending: list[tuple[int, str, JournalEntry | Overflowed | ListStart, bytes]] = []
        """Records not written yet: (notification seq, uid, fact, encoded record), in seq order."""
        self._appended = 0
        """Records ever queued (a record's ticket is the count once it is queued)."""
        self._released = 0
        """Records ever taken off the queue by a write that succeeded (written, or released
        unrecorded when the journal was full)."""
        self._queued_seq = -1
        """The highest notification seq whose record was queued."""
        self._written_seq = -1
        """The highest notification seq whose record is durable (every earlier one is too)."""
        self._committed = asyncio.Event()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        """Set while the writer has nothing to do (everything noted is on disk)."""
        self._compact_to: Checkpoint | None = None
        self._compact_requested = False
        self._start: ListStart | None = None
        """The first list's record while no checkpoint was written (see :class:`ListStart`)."""
        self._durable_start: ListStart | None = None
        self._gap_from = ""
        """Inside a relist's gap (between its begin and end notifications): the gap's ``from``."""
        self._gap_inferred: set[str] = set()
        """uids of the deletes the relist in progress inferred (bounded at its end)."""
        self.commits = 0
        """Group commits done (each one write + fsync)."""
        self.records = 0
        """Records appended."""
        self.write_errors = 0
        self.skipped = 0
        """Relisted states released unrecorded because the journal was full (:meth:`_optional`)."""
        self.unreadable = ""
        """Why the journal left by the previous run could not be read at :meth:`load` ("" = it
        was read, or there was none): the objects it recorded are unknown (see the pipeline)."""
        self.last_error = ""
        """Why the last write failed, until a write succeeds ("" = fine): readiness reports it."""

    @property
    def backend(self) -> JournalBackend:
        return self._backend

    # ---------------------------------------------------------------------------------------------
    # loading

    async def load(self, checkpoint: Checkpoint | None) -> dict[str, JournalEntry]:
        """Reads the journal left by the previous run (uid → newest fact; empty when there is none)
        and makes ``checkpoint`` (the one the informer resumes from) the compaction base. The file
        is rewritten, compacted, by :meth:`run` before any new record is appended."""
        self._checkpoint = _checkpoint_uids(checkpoint)
        self._base = checkpoint
        self._entries = await self._read()
        self._durable = dict(self._entries)
        self._durable_overflowed = dict(self._overflowed)
        if checkpoint is not None:
            self._start = None
        self._durable_start = self._start
        self._compact_requested = True
        return dict(self._entries)

    def adopt(self, entries: Mapping[str, JournalEntry],
              keep: Callable[[str], bool] | None = None) -> dict[str, JournalEntry]:
        """After :meth:`load`, before :meth:`run`: a shard taking objects over from other shards'
        checkpoints (:mod:`bridge.delivery.sharding`) drops the records of uids ``keep`` refuses
        (objects it no longer owns) and adds the other journals' records of the objects it took.
        They are written by the compaction :meth:`run` starts with. Returns uid → newest fact."""
        if keep is not None:
            self._entries = {uid: e for uid, e in self._entries.items() if keep(uid)}
            self._durable = {uid: e for uid, e in self._durable.items() if keep(uid)}
        for uid, e in entries.items():
            mine = self._entries.get(uid)
            if mine is None or int(e.resource_version) > int(mine.resource_version):
                self._entries[uid] = self._durable[uid] = e
        self._compact_requested = True
        return dict(self._entries)

    async def _read(self) -> dict[str, JournalEntry]:
        self.unreadable = ""
        self._overflowed = {}
        try:
            data = await self._backend.read()
        except (OSError, CheckpointError) as exc:
            return self._unreadable(f"{type(exc).__name__}: {exc}")
        if data is None:
            return {}
        lines = data.split(b"\n")
        entries: dict[str, JournalEntry] = {}
        overflowed: dict[tuple[str, str], Overflowed] = {}
        self._start = None
        try:
            check_header(lines[0], self._informer_id)
        except ValueError as exc:
            return self._unreadable(str(exc))
        complete = lines[1:-1]  # the last element follows the last newline: empty, or a torn line
        if lines[-1]:
            log.warning("journal %s ends with a torn record (a crash while appending); ignoring it",
                        self._backend.name)
        for n, line in enumerate(complete, start=2):
            try:
                record = decode_line(line)
            except (ValueError, TypeError, IndexError) as exc:
                # Only the last line can be torn (appends are whole lines, and a failed append is
                # followed by a rewrite): a bad line before it is damage, and the records after it
                # are lost.
                return self._unreadable(f"line {n} is corrupt ({exc})")
            if isinstance(record, ListStart):
                self._start = record
            elif isinstance(record[1], Overflowed):
                overflowed[(record[1].sink, record[0])] = record[1]
            else:
                entries[record[0]] = record[1]
        self._overflowed = overflowed
        return entries

    def _unreadable(self, reason: str) -> dict[str, JournalEntry]:
        self.unreadable = reason
        log.warning("journal %s cannot be read (%s): the objects it recorded (delivered after the last "
                    "checkpoint write) are unknown", self._backend.name, reason,
                    extra={"informer": self._informer_id})
        return {}

    # ---------------------------------------------------------------------------------------------
    # recording (the informer's delivery observer calls note() for every dispatched notification)

    def note(self, notification: Notification, *, inferred: bool) -> None:
        """Queues the record a dispatched notification needs, if any: the object's first appearance
        in what the durable state knows, or a delete. Synchronous; :meth:`wait` tells when it is
        on disk. ``inferred``: whether a delete goes out marked ``finalstateunknown``, as the sinks
        receive it — recorded as is, so that a restart re-sending it keeps the marking (a relist's
        tombstone of a delete already sent observed goes out observed again)."""
        n = notification
        if n.kind is NotificationKind.GAP and n.gap is not None and n.seq >= 0:
            self._gap_from = "" if n.gap.end else n.gap.from_resource_version
            if n.gap.end:
                self._bound_inferred(n.seq, n.gap.to_resource_version)
            self._gap_inferred.clear()
            return
        if n.seq < 0 or n.kind is NotificationKind.SNAPSHOT or n.kind is NotificationKind.GAP:
            return
        obj = n.obj
        if isinstance(obj, DeletedFinalStateUnknown):
            obj = obj.obj
        uid, rv = object_identity(obj)
        if not uid:
            return
        key = str(n.key)
        if n.kind is NotificationKind.DELETE:
            held = ""
            prev = self._entries.get(uid)
            if isinstance(prev, Deleted):  # a delete replayed after a restart
                held = prev.held_after or (prev.resource_version
                                           if prev.inferred and prev.resource_version != rv else "")
            elif isinstance(prev, Relisted):  # sinks may hold a relist's state of it
                held = prev.windows()[0][0]
            entry: JournalEntry = Deleted(key, rv, inferred=inferred, held_after=held)
            self._entries[uid] = entry
            self._queue(n.seq, uid, entry)
            if inferred and self._gap_from:
                self._gap_inferred.add(uid)
            return
        known = self._entries.get(uid)
        if isinstance(known, Deleted) and rv_at_most(rv, known.sent_before or known.resource_version):
            # History replayed from before a delete already sent (up to the list that inferred it,
            # when a relist did): that record stays the fact, or a later replay would send it again.
            return
        if self._gap_from:
            # A relist's state: recorded (and released once durable) even for a known object, so
            # that a restart whose watch replays the changes it coalesced holds them back.
            added = n.kind is NotificationKind.ADD
            entry = (known.after(self._gap_from, rv, added=added) if isinstance(known, Relisted)
                     and is_rv(self._gap_from) else Relisted(key, rv, self._gap_from, added=added))
            self._entries[uid] = entry
            self._queue(n.seq, uid, entry)
            return
        if isinstance(known, (Exists, Relisted)) or self._checkpoint.get(uid) == key:
            return
        entry = Exists(key, rv)
        self._entries[uid] = entry
        self._queue(n.seq, uid, entry)

    def _bound_inferred(self, seq: int, list_rv: str) -> None:
        """The relist's end: records, with each delete it inferred, the list's resourceVersion
        (:attr:`Deleted.sent_before`)."""
        if not is_rv(list_rv):
            return
        for uid in self._gap_inferred:
            e = self._entries.get(uid)
            if isinstance(e, Deleted) and e.inferred and not e.sent_before:
                entry = replace(e, sent_before=list_rv)
                self._entries[uid] = entry
                self._queue(seq, uid, entry)

    def listed(self, seq: int, resource_version: str) -> None:
        """The informer of a start without a checkpoint has dispatched its first list, at
        ``resource_version``, before the notification ``seq``: recorded before anything after the
        list is released (:class:`ListStart`)."""
        if self._base is not None or self._start is not None:
            return
        self._start = ListStart(resource_version)
        self._queue(seq, "", self._start)

    def acknowledged(self, resource_version: str) -> None:
        """Every sink has acknowledged everything up to ``resource_version`` (the first resume point
        of a start without a checkpoint): recorded without holding anything back."""
        if self._base is not None or self._start is None or self._start.acknowledged:
            return
        self._start = ListStart(resource_version, acknowledged=True)
        self._pending.append((self._queued_seq, "", self._start, encode_start(self._start)))
        self._appended += 1
        self._idle.clear()
        self._wake.set()

    @property
    def start(self) -> ListStart | None:
        """After :meth:`load`: the first list's record of a run that wrote no checkpoint."""
        return self._start

    @property
    def overflowed(self) -> dict[str, dict[str, Overflowed]]:
        """After :meth:`load`: sink → uid → the state its overflow window handed over last."""
        out: dict[str, dict[str, Overflowed]] = {}
        for (sink, uid), e in self._overflowed.items():
            out.setdefault(sink, {})[uid] = e
        return out

    def note_overflowed(self, sink: str, uid: str, *, key: str, resource_version: str, since: str,
                        type_: str) -> int:
        """Queues that ``sink``'s overflow window (from ``since``) hands over this state of ``uid``;
        returns the ticket to :meth:`wait_recorded` for before it goes out. A window that overlaps
        the one recorded (the sink degraded again before a checkpoint covered it) keeps the earlier
        ``since``: what either coalesced never went to the sink one by one."""
        known = self._overflowed.get((sink, uid))
        if known is not None and is_rv(since) and int(known.resource_version) > int(since):
            since = min(known.since, since, key=int)
        entry = Overflowed(key, resource_version, sink, since, type_)
        self._overflowed[(sink, uid)] = entry
        self._queue(max(self._queued_seq, 0), uid, entry)  # after every record queued: in seq order
        return self._appended

    async def wait_recorded(self, ticket: int) -> None:
        """Returns once the record :meth:`note_overflowed` gave ``ticket`` for, and every one queued
        before it, is durable (or was released unrecorded, the journal being full)."""
        while self._released < ticket:
            await self._committed.wait()

    def note_window(self, sink: str, events: Sequence[ChangeEvent], window: GapInfo) -> int | None:
        """:meth:`note_overflowed` for each change among ``events`` that ``sink``'s overflow
        ``window`` hands over bare (not framed by a window of its own); returns the ticket to
        :meth:`wait_recorded` for (None: nothing noted)."""
        seq: int | None = None
        for e in events:
            if e.gap is window and e.type in _WINDOW_TYPES and e.uid:
                key = f"{e.namespace}/{e.name}" if e.namespace else e.name
                seq = self.note_overflowed(sink, e.uid, key=key, resource_version=e.resource_version,
                                           since=window.from_resource_version, type_=str(e.type))
        return seq

    def _queue(self, seq: int, uid: str, entry: JournalEntry | Overflowed | ListStart) -> None:
        record = encode_start(entry) if isinstance(entry, ListStart) else encode_record(uid, entry)
        self._pending.append((seq, uid, entry, record))
        self._appended += 1
        self._queued_seq = seq
        self._idle.clear()
        self._wake.set()

    def must_wait(self, seq: int) -> bool:
        """True while a record of a notification up to ``seq`` is not durable yet."""
        return self._written_seq < min(seq, self._queued_seq)

    async def wait(self, seq: int) -> None:
        """Returns once every record of notifications up to ``seq`` is durable."""
        while self._written_seq < min(seq, self._queued_seq):
            await self._committed.wait()

    def compact(self, checkpoint: Checkpoint) -> None:
        """``checkpoint`` was written: the records it implies can go (done by the writer task)."""
        self._compact_to = checkpoint
        self._idle.clear()
        self._wake.set()

    async def idle(self) -> None:
        """Returns once every queued record and compaction is written (for a clean shutdown)."""
        await self._idle.wait()

    # ---------------------------------------------------------------------------------------------
    # the writer task

    async def run(self) -> None:
        """Writes queued records (one write + fsync per batch) and compactions, until cancelled."""
        while True:
            if not (self._pending or self._compact_to is not None or self._compact_requested):
                self._wake.clear()
                self._idle.set()
                await self._wake.wait()
                continue
            try:
                await self._write_once()
            except (OSError, CheckpointStoreError) as exc:
                self.write_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.error("journal %s cannot be written (%s); new objects and deletes wait for it, "
                          "retrying in %.0f s", self._backend.name, exc, _RETRY_DELAY)
                await self._clock.sleep(_RETRY_DELAY)

    async def _write_once(self) -> None:
        """One write: a compaction (rewrites what the storage holds, less what the last checkpoint
        written implies) or one group commit of pending records (as many as the backend has room
        for, in order)."""
        if self._compact_to is not None or self._compact_requested:
            await self._compact_once()
            return
        batch, consumed = self._fit(self._backend.room())
        last = self._pending[consumed - 1][0]
        if batch:
            try:
                await self._backend.append(b"\n".join(record for *_, record in batch) + b"\n")
            except BaseException:
                # A failed append may have left a torn line: the retry rewrites the whole journal.
                self._compact_requested = True
                raise
            for _, uid, entry, _ in batch:
                if isinstance(entry, ListStart):
                    if self._base is None:
                        self._durable_start = entry
                elif isinstance(entry, Overflowed):
                    self._durable_overflowed[(entry.sink, uid)] = entry
                else:
                    self._durable[uid] = entry
            self.records += len(batch)
        del self._pending[:consumed]  # note() only ever appends meanwhile
        self._released += consumed
        self._done(last)

    def _fit(self, room: int | None
             ) -> tuple[list[tuple[int, str, JournalEntry | Overflowed | ListStart, bytes]], int]:
        """The pending records the next append writes, and how many pending records it consumes
        (those written, and the relisted states released unrecorded when they do not fit)."""
        batch = list(self._pending)
        if room is None:
            return batch, len(batch)
        kept: list[tuple[int, str, JournalEntry | Overflowed | ListStart, bytes]] = []
        skipped = consumed = size = 0
        for item in batch:
            _, uid, entry, record = item
            if size + len(record) + 1 <= room:
                size += len(record) + 1
                kept.append(item)
            elif isinstance(entry, Relisted) and self._optional(uid, entry):
                self._skip(uid, entry)
                skipped += 1
            elif isinstance(entry, Overflowed):
                # Optional too: held, it would stall the degraded sink, whose window holds back
                # the checkpoint that would compact the journal.
                if self._overflowed.get((entry.sink, uid)) is entry:
                    durable = self._durable_overflowed.get((entry.sink, uid))
                    if durable is None:
                        self._overflowed.pop((entry.sink, uid), None)
                    else:
                        self._overflowed[(entry.sink, uid)] = durable
                skipped += 1
            else:
                break
            consumed += 1
        if skipped:
            self.skipped += skipped
            log.warning("journal %s is full: %d states a relist or a sink's overflow window sent "
                        "were released unrecorded; a crash before the next checkpoint write may "
                        "re-send, after them, changes that window coalesced", self._backend.name, skipped,
                        extra={"informer": self._informer_id})
        if consumed == 0:
            # Nothing is released unrecorded, not even a first list larger than the journal
            # (which no checkpoint can compact before it is delivered: it waits, and readiness
            # says why). Only a backend without chunking is bounded.
            raise BlobStoreError(
                f"journal {self._backend.name} is full: {len(batch)} records wait for the next "
                "checkpoint write to compact it (more objects were created or deleted since the "
                "last checkpoint write than it holds)")
        return kept, consumed

    async def _compact_once(self) -> None:
        """Rewrites what the storage holds, less what the last checkpoint written implies."""
        cp = self._compact_to
        if cp is not None:
            self._checkpoint = _checkpoint_uids(cp)
            self._base = cp
            self._start = self._durable_start = None
        self._entries = {uid: e for uid, e in self._entries.items() if self._needed(uid, e)}
        durable = {uid: e for uid, e in self._durable.items() if self._needed(uid, e)}
        self._overflowed = {k: e for k, e in self._overflowed.items() if not self._passed(e)}
        overflowed = {k: e for k, e in self._durable_overflowed.items() if not self._passed(e)}
        lines = [encode_header(self._informer_id)]
        if self._durable_start is not None:
            lines.append(encode_start(self._durable_start))
        lines.extend(encode_record(uid, e) for uid, e in durable.items())
        lines.extend(encode_record(uid, e) for (_, uid), e in overflowed.items())
        try:
            await self._backend.rewrite(b"\n".join(lines) + b"\n")
        except BaseException:
            self._compact_requested = True
            raise
        self._durable = durable
        self._durable_overflowed = overflowed
        if self._compact_to is cp:
            self._compact_to = None
        self._compact_requested = False
        self._done(None)

    def _optional(self, uid: str, entry: Relisted) -> bool:
        """Whether a record may be left out when the journal is full: a relist's state of an object
        the durable state knows. Without it a crash may break per-object order (section 2 of the
        delivery contract), never lose an object or a delete; holding it would stall the relist —
        for good when the relist is larger than the journal, as nothing compacts it meanwhile."""
        durable = self._durable.get(uid)
        return self._checkpoint.get(uid) == entry.key or isinstance(durable, (Exists, Relisted))

    def _skip(self, uid: str, entry: JournalEntry) -> None:
        """``entry`` is released unrecorded: the journal's view of ``uid`` is what is stored."""
        if self._entries.get(uid) is entry:
            durable = self._durable.get(uid)
            if durable is None:
                self._entries.pop(uid, None)
            else:
                self._entries[uid] = durable

    def _done(self, last: int | None) -> None:
        """A write succeeded; ``last`` is the seq of the last record it appended. Every notification
        up to it (up to the last queued when nothing is pending) is released."""
        self.commits += 1
        self.last_error = ""
        target = self._queued_seq if not self._pending else last
        if target is not None and target > self._written_seq:
            self._written_seq = target
        committed, self._committed = self._committed, asyncio.Event()
        committed.set()  # the waiters look again (wait, wait_recorded)

    def _passed(self, e: Overflowed) -> bool:
        """Whether the last checkpoint written covers a state an overflow window handed over (every
        sink acknowledged past it)."""
        cp = self._base
        return (cp is not None and is_rv(cp.resource_version)
                and int(e.resource_version) <= int(cp.resource_version))

    def _needed(self, uid: str, e: JournalEntry) -> bool:
        """A record the last checkpoint does not imply: an object it does not know to exist, or a
        delete not every sink acknowledged yet.

        The delete of an object the checkpoint does not know (created and deleted since it) is still
        needed while the checkpoint does not cover it: a sink that lags may hold the object's add and
        not its delete, and after a crash with expired history only this record makes the relist
        report the object deleted to it."""
        known_alive = self._checkpoint.get(uid) == e.key
        if not isinstance(e, Deleted):
            return not known_alive or (isinstance(e, Relisted) and not self._covered(e, uid))
        return known_alive or not self._covered(e, uid)

    def _covered(self, e: JournalEntry, uid: str) -> bool:
        """Whether every sink acknowledged the delete ``e`` (or a relist's state of a live object):
        the checkpoint's resourceVersion reaches it, or its delivered-ahead map has the key deleted
        at it or later (for a live object: that uid at it or later)."""
        cp = self._base
        if cp is None:
            return False
        deleted = isinstance(e, Deleted)
        bound = e.sent_before if isinstance(e, Deleted) else ""
        if isinstance(e, Deleted) and e.inferred and not bound and uid in self._gap_inferred:
            return False  # its relist has not ended: the bound is not known yet
        try:
            rv = int(bound or e.resource_version)
            if rv <= int(cp.resource_version):
                return True
            ahead = cp.ahead.get(e.key)
            if ahead is None or int(ahead[1]) < rv:
                return False
            return ahead[2] if deleted else ahead[0] == uid
        except ValueError:
            return False


