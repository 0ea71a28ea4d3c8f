"""The known-object journal: what sinks may have received, made durable before they receive it.

A checkpoint (:mod:`bridge.delivery.checkpoint`) is written every ``checkpoint.interval`` and knows
the objects as of its resourceVersion. Between two writes the bridge keeps delivering: an object
created after the last write may reach a sink, and its delete may reach a sink too. After a crash
the bridge resumes from the checkpoint; if the server's history has expired meanwhile (410) it
relists, and a relist can only report deletes of objects the bridge knows. So this module keeps the
invariant the delivery contract promises:

    **Every object any sink may have received as existing is known after any crash**: it is in the
    last checkpoint written, or in this journal. And every delete any sink may have received is
    known the same way, with its resourceVersion and whether it was inferred.

It holds because of one rule, enforced by the sink listeners (:class:`~bridge.pipeline.SinkListener`
awaits :meth:`KnownObjectJournal.wait`): **the first event of an object the durable state does not
know (its first add, or the first update of an object the bridge resumed without knowing), and every
delete, is released to the sinks only once its journal record is durable.** Records are appended by
one writer task and made durable by one write per batch (group commit), so a burst of new objects
costs one or two writes of latency, not one each; updates of known objects never wait, except the
states a relist sends inside its gap: they are recorded with the gap's ``from`` (a restart whose
watch replays the changes that relist coalesced must not send them after those states, see
:attr:`JournalEntry.coalesced_from`).

Where the bytes live is a :class:`JournalBackend` of the checkpoint store (its ``journal_backend``):
a file next to a file checkpoint (one append + ``fdatasync`` per batch), a ConfigMap next to a
ConfigMap checkpoint, a key of a NATS KV checkpoint bucket (one compare-and-set write each, fenced
like the checkpoint; beyond one value the journal spans sealed chunks written by the storage
layer's one chunked writer, :class:`~bridge.delivery.blobstore.ChunkedValue`, so it records any
number of objects). A backend with a size limit (a ConfigMap journal whose store may not shard)
reports its :meth:`~JournalBackend.room`: a batch appends the records that fit and the others wait
for the compaction after the next checkpoint write — nothing is ever released unrecorded.

What a resumed bridge does with it (:meth:`BridgePipeline._prepare`): a journalled delete of an
object the checkpoint knows replaces that object's stub resourceVersion by the delete's, so whatever
the restart re-sends for it carries the same resourceVersion and id as the delete already sent (never
an older, inferred one); objects only the journal knows are handed to the informer as *unconfirmed*
(:meth:`~bridge.shared_informer.SharedIndexInformer.seed_unconfirmed`): a relist that does not return
one reports it deleted.

After every checkpoint write the journal is compacted: records the new checkpoint already implies are
dropped and the journal is rewritten (the file: temporary file, fsync, rename), so it holds about
what changed in one checkpoint interval.

Format (the file ``<informer id>.journal`` next to a file checkpoint; the same text in the other
backends): a header line ``{"journal": 1,
"informer_id": …}``, then one JSON array per line, ``["a", key, uid, rv]`` (known to exist) or
``["d", key, uid, rv, inferred]`` (deleted; ``["d", key, uid, rv, inferred, held_after, sent_before]``
once the relist that inferred it ended, see :attr:`JournalEntry.sent_before`;
``["d", key, uid, rv, inferred, held_after]`` for a
delete sent after a replay that held back changes an earlier, inferred delete had coalesced, or after
a state a relist sent, see :attr:`JournalEntry.held_after`) or ``["r", key, uid, rv, from, added]``
(known to exist, sent by a relist at ``rv``: the changes after ``from`` before it were coalesced, see
:attr:`JournalEntry.coalesced_from`). A torn last line (a crash mid-append: its events were
never released) and anything after a line that does not parse are ignored with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import orjson

from bridge.clock import Clock, RealClock
from bridge.contracts import DeletedFinalStateUnknown, Notification, NotificationKind
from bridge.delivery.blob_file import FileJournalBackend
from bridge.delivery.blobstore import JournalBackend
from bridge.delivery.checkpoint import Checkpoint
from bridge.delivery.fencing import BlobStoreError, CheckpointError, CheckpointStoreError
from bridge.rawobject import object_identity

__all__ = ["FileJournalBackend", "JournalBackend", "JournalEntry", "JournalStoreError", "KnownObjectJournal"]

log = logging.getLogger(__name__)

_VERSION = 1
_RETRY_DELAY = 1.0
"""Seconds between attempts when the journal cannot be written (events wait meanwhile)."""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """The newest durable fact about one uid."""

    key: str
    resource_version: str
    deleted: bool = False
    inferred: bool = False
    """For a delete: it was inferred by a relist (sent with ``finalstateunknown``)."""
    held_after: str = ""
    """For a delete a restarted bridge sent after an earlier, inferred delete of the same uid: the
    resourceVersion of the state that inferred delete carried. The changes after it were coalesced by
    that relist and never sent one by one, so a replay after another restart keeps holding them back
    (:meth:`~bridge.delivery.pipeline.SinkListener._replayed_after_delete`). Also for a delete of
    an object a relist had sent (:attr:`coalesced_from`): that relist's ``from``."""
    coalesced_from: str = ""
    """For an object a relist sent (an ``added`` or ``updated`` inside a gap): the gap's ``from``, the
    last resourceVersion the informer had observed one by one. The object's changes after it and
    before :attr:`resource_version` were coalesced by the relist and never sent; a watch that a
    restart resumes from a checkpoint older than the relist replays them, and they must not go out
    after the newer state sinks may hold (per-object order:
    :meth:`~bridge.delivery.pipeline.SinkListener._replayed_coalesced`). Kept until the checkpoint
    covers that state."""
    sent_before: str = ""
    """For a delete a relist inferred: the resourceVersion of that relist's list (its gap's end),
    no older than the real delete. A checkpoint whose resourceVersion is older (the relist's start:
    a sink had not acknowledged the relist's end) may no longer hold the object, and the inferred
    delete's own resourceVersion (the stale state it carries) may be older than the checkpoint's;
    yet a watch resumed from it replays the changes the relist coalesced, which only this record
    holds back. So the record is kept until the checkpoint's resourceVersion reaches this one
    (recorded once the relist's end is dispatched; until then, kept)."""
    coalesced_added: bool = False
    """With :attr:`coalesced_from`: the relist sent the state as ``added`` (else ``updated``), so the
    replay re-sends it with the same type, hence the same id."""


JournalStoreError = BlobStoreError
"""A journal's store could not read or write (the API server refused, the data is too large)."""


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

    def __init__(self, *, informer_id: str, backend: JournalBackend | None = None,
                 path: str | os.PathLike[str] | None = None, fsync: bool = True,
                 clock: Clock | None = None) -> None:
        """``backend`` stores the journal; ``path`` is short for a :class:`FileJournalBackend`."""
        if backend is None:
            if path is None:
                raise ValueError("a journal needs a backend or a path")
            backend = FileJournalBackend(path, fsync=fsync)
        self._backend: JournalBackend = backend
        self._path = backend.path if isinstance(backend, FileJournalBackend) else None
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
        self._pending: list[tuple[int, str, JournalEntry, bytes]] = []
        """Records not written yet: (notification seq, uid, fact, encoded record), in seq order."""
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

    @property
    def path(self) -> Path:
        """The file of a file-backed journal."""
        if self._path is None:
            raise AttributeError(f"journal {self._backend.name} is not a file")
        return self._path

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
        try:
            data = await self._backend.read()
        except (OSError, CheckpointError) as exc:
            return self._unreadable(f"{type(exc).__name__}: {exc}")
        if data is None:
            return {}
        lines = data.split(b"\n")
        entries: dict[str, JournalEntry] = {}
        try:
            head = orjson.loads(lines[0])
            if head.get("journal") != _VERSION or head.get("informer_id") != self._informer_id:
                raise ValueError(f"header {lines[0][:200]!r} is not this informer's journal")
        except (orjson.JSONDecodeError, ValueError, AttributeError) as exc:
            return self._unreadable(str(exc))
        complete = lines[1:-1]  # the last element follows the last newline: empty, or a torn line
        if lines[-1]:
            log.warning("journal %s ends with a torn record (a crash while appending); ignoring it",
                        self._backend.name)
        for n, line in enumerate(complete, start=2):
            try:
                uid, entry = _parse(line)
            except (orjson.JSONDecodeError, ValueError, TypeError, IndexError) as exc:
                # Only the last line can be torn (appends are whole lines, and a failed append is
                # followed by a rewrite): a bad line before it is damage, and the records after it
                # are lost.
                return self._unreadable(f"line {n} is corrupt ({exc})")
            entries[uid] = entry
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
            if prev is not None and prev.deleted:  # a delete replayed after a restart
                held = prev.held_after or (prev.resource_version
                                           if prev.inferred and prev.resource_version != rv else "")
            elif prev is not None and prev.coalesced_from:  # sinks may hold a relist's state of it
                held = prev.coalesced_from
            entry = JournalEntry(key, rv, deleted=True, inferred=inferred, held_after=held)
            self._entries[uid] = entry
            self._queue(n.seq, uid, entry)
            if inferred and self._gap_from:
                self._gap_inferred.add(uid)
            return
        known = self._entries.get(uid)
        if self._gap_from:
            # A relist's state: recorded (and released once durable) even for a known object, so
            # that a restart whose watch replays the changes it coalesced holds them back.
            since = (known.coalesced_from if known is not None and known.coalesced_from
                     and not known.deleted else self._gap_from)
            entry = JournalEntry(key, rv, coalesced_from=since,
                                 coalesced_added=n.kind is NotificationKind.ADD)
            self._entries[uid] = entry
            self._queue(n.seq, uid, entry)
            return
        if (known is not None and not known.deleted) or self._checkpoint.get(uid) == key:
            return
        entry = JournalEntry(key, rv)
        self._entries[uid] = entry
        self._queue(n.seq, uid, entry)

    def _bound_inferred(self, seq: int, list_rv: str) -> None:
        """The relist's end: records, with each delete it inferred, the list's resourceVersion
        (:attr:`JournalEntry.sent_before`)."""
        if not (list_rv.isascii() and list_rv.isdigit()):
            return
        for uid in self._gap_inferred:
            e = self._entries.get(uid)
            if e is not None and e.deleted and e.inferred and not e.sent_before:
                entry = replace(e, sent_before=list_rv)
                self._entries[uid] = entry
                self._queue(seq, uid, entry)

    def _queue(self, seq: int, uid: str, entry: JournalEntry) -> None:
        self._pending.append((seq, uid, entry, _record(uid, entry)))
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
        try:
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
        finally:
            await self._backend.close()

    async def _write_once(self) -> None:
        """One write: a compaction (rewrites what the storage holds, less what the last checkpoint
        written implies) or one group commit of pending records (as many as the backend has room
        for, in order)."""
        if self._compact_to is not None or self._compact_requested:
            await self._compact_once()
            return
        batch = list(self._pending)
        consumed = len(batch)
        room = self._backend.room()
        if room is not None:
            kept: list[tuple[int, str, JournalEntry, bytes]] = []
            skipped = consumed = size = 0
            for item in batch:
                _, uid, entry, record = item
                if size + len(record) + 1 <= room:
                    size += len(record) + 1
                    kept.append(item)
                elif self._optional(uid, entry):
                    self._skip(uid, entry)
                    skipped += 1
                else:
                    break
                consumed += 1
            if skipped:
                self.skipped += skipped
                log.warning("journal %s is full: %d states a relist sent were released unrecorded; a "
                            "crash before the next checkpoint write may re-send, after them, changes "
                            "that relist coalesced", self._backend.name, skipped,
                            extra={"informer": self._informer_id})
            if consumed == 0:
                # Nothing is released unrecorded, not even a first list larger than the journal
                # (which no checkpoint can compact before it is delivered: it waits, and readiness
                # says why). Only a backend without chunking is bounded.
                raise JournalStoreError(
                    f"journal {self._backend.name} is full: {len(batch)} records wait for the next "
                    "checkpoint write to compact it (more objects were created or deleted since the "
                    "last checkpoint write than it holds)")
            if not kept:
                del self._pending[:consumed]
                self._done(batch[consumed - 1][0])
                return
            last, batch = batch[consumed - 1][0], kept
        try:
            await self._backend.append(b"\n".join(record for *_, record in batch) + b"\n")
        except BaseException:
            # A failed append may have left a torn line: the retry rewrites the whole journal.
            self._compact_requested = True
            raise
        del self._pending[:consumed]  # note() only ever appends meanwhile
        for _, uid, entry, _ in batch:
            self._durable[uid] = entry
        self.records += len(batch)
        self._done(last if room is not None else batch[-1][0])

    async def _compact_once(self) -> None:
        """Rewrites what the storage holds, less what the last checkpoint written implies."""
        cp = self._compact_to
        if cp is not None:
            self._checkpoint = _checkpoint_uids(cp)
            self._base = cp
        self._entries = {uid: e for uid, e in self._entries.items() if self._needed(uid, e)}
        durable = {uid: e for uid, e in self._durable.items() if self._needed(uid, e)}
        lines = [orjson.dumps({"journal": _VERSION, "informer_id": self._informer_id})]
        lines.extend(_record(uid, e) for uid, e in durable.items())
        try:
            await self._backend.rewrite(b"\n".join(lines) + b"\n")
        except BaseException:
            self._compact_requested = True
            raise
        self._durable = durable
        if self._compact_to is cp:
            self._compact_to = None
        self._compact_requested = False
        self._done(None)

    def _optional(self, uid: str, entry: JournalEntry) -> bool:
        """Whether a record may be left out when the journal is full: a relist's state of an object
        the durable state knows. Without it a crash may break per-object order (section 2 of the
        delivery contract), never lose an object or a delete; holding it would stall the relist —
        for good when the relist is larger than the journal, as nothing compacts it meanwhile."""
        if entry.deleted or not entry.coalesced_from:
            return False
        durable = self._durable.get(uid)
        return self._checkpoint.get(uid) == entry.key or (durable is not None and not durable.deleted)

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
            committed.set()

    def _needed(self, uid: str, e: JournalEntry) -> bool:
        """A record the last checkpoint does not imply: an object it does not know to exist, or a
        delete not every sink acknowledged yet.

        The delete of an object the checkpoint does not know (created and deleted since it) is still
        needed while the checkpoint does not cover it: a sink that lags may hold the object's add and
        not its delete, and after a crash with expired history only this record makes the relist
        report the object deleted to it."""
        known_alive = self._checkpoint.get(uid) == e.key
        if not e.deleted:
            return not known_alive or (bool(e.coalesced_from) and not self._covered(e, uid))
        return known_alive or not self._covered(e, uid)

    def _covered(self, e: JournalEntry, uid: str) -> bool:
        """Whether every sink acknowledged the delete ``e`` (or a relist's state of a live object):
        the checkpoint's resourceVersion reaches it, or its delivered-ahead map has the key deleted
        at it or later (for a live object: that uid at it or later)."""
        cp = self._base
        if cp is None:
            return False
        if e.deleted and e.inferred and not e.sent_before and uid in self._gap_inferred:
            return False  # its relist has not ended: the bound is not known yet
        try:
            rv = int(e.sent_before or e.resource_version)
            if rv <= int(cp.resource_version):
                return True
            ahead = cp.ahead.get(e.key)
            if ahead is None or int(ahead[1]) < rv:
                return False
            return ahead[2] if e.deleted else ahead[0] == uid
        except ValueError:
            return False


def _record(uid: str, e: JournalEntry) -> bytes:
    if e.coalesced_from and not e.deleted:
        return orjson.dumps(["r", e.key, uid, e.resource_version, e.coalesced_from, e.coalesced_added])
    if e.deleted:
        if e.sent_before:
            return orjson.dumps(["d", e.key, uid, e.resource_version, e.inferred, e.held_after,
                                 e.sent_before])
        if e.held_after:
            return orjson.dumps(["d", e.key, uid, e.resource_version, e.inferred, e.held_after])
        return orjson.dumps(["d", e.key, uid, e.resource_version, e.inferred])
    return orjson.dumps(["a", e.key, uid, e.resource_version])


def _parse(line: bytes) -> tuple[str, JournalEntry]:
    rec = orjson.loads(line)
    op, key, uid, rv = rec[0], rec[1], rec[2], rec[3]
    if not (isinstance(key, str) and key and isinstance(uid, str) and uid):
        raise ValueError("a record without key or uid")
    if not (isinstance(rv, str) and rv.isascii() and rv.isdigit()):
        raise ValueError(f"resourceVersion {rv!r} is not a resourceVersion")
    if op == "a" and len(rec) == 4:
        return uid, JournalEntry(key, rv)
    if (op == "r" and len(rec) == 6 and isinstance(rec[4], str) and rec[4].isascii() and rec[4].isdigit()
            and isinstance(rec[5], bool)):
        return uid, JournalEntry(key, rv, coalesced_from=rec[4], coalesced_added=rec[5])
    if op == "d" and len(rec) == 5 and isinstance(rec[4], bool):
        return uid, JournalEntry(key, rv, deleted=True, inferred=rec[4])
    if (op == "d" and len(rec) == 6 and isinstance(rec[4], bool) and isinstance(rec[5], str)
            and rec[5].isascii() and rec[5].isdigit()):
        return uid, JournalEntry(key, rv, deleted=True, inferred=rec[4], held_after=rec[5])
    if (op == "d" and len(rec) == 7 and isinstance(rec[4], bool) and isinstance(rec[5], str)
            and (rec[5] == "" or (rec[5].isascii() and rec[5].isdigit())) and isinstance(rec[6], str)
            and rec[6].isascii() and rec[6].isdigit()):
        return uid, JournalEntry(key, rv, deleted=True, inferred=rec[4], held_after=rec[5],
                                 sent_before=rec[6])
    raise ValueError(f"unknown record {rec!r}")


def entries_by_key(entries: Mapping[str, JournalEntry]) -> dict[str, list[tuple[str, JournalEntry]]]:
    """key → [(uid, entry)], oldest resourceVersion first."""
    out: dict[str, list[tuple[str, JournalEntry]]] = {}
    for uid, e in entries.items():
        out.setdefault(e.key, []).append((uid, e))
    for items in out.values():
        items.sort(key=lambda item: int(item[1].resource_version))
    return out
