"""The known-object journal: which notifications need a record, group commit, the gate, torn and
corrupt files, compaction against the checkpoint written."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import orjson
import pytest

from bridge.contracts import DeletedFinalStateUnknown, Gap, Notification, NotificationKind, ObjectKey
from bridge.delivery.journal import Deleted, KnownObjectJournal, Relisted
from bridge.delivery.journal_records import Overflowed, decode_line
from bridge.storage.blob_file import FileBlobStore
from bridge.storage.blobstore import JournalBackend
from bridge.storage.checkpoint import Checkpoint, FileCheckpointStore
from tests.checkpoint.helpers import until

IDENT = "configmaps.ns.abc"


def obj(name: str, uid: str, rv: str) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid, "resourceVersion": rv}}


def note(j: KnownObjectJournal, seq: int, kind: NotificationKind, name: str, uid: str, rv: str,
         *, tombstone: bool = False, inferred: bool = False) -> None:
    o = obj(name, uid, rv)
    key = ObjectKey(f"ns/{name}")
    target = DeletedFinalStateUnknown(key, o) if tombstone else o
    j.note(Notification(kind=kind, obj=target, seq=seq, key=key), inferred=inferred)


def file_journal(path: Path, files: type[FileBlobStore] = FileBlobStore) -> JournalBackend:
    """The journal file ``path`` as the file checkpoint store keeps it (``files``: a test's holds a write)."""
    store = FileCheckpointStore(directory=path.parent, files=files)
    return store.journal_backend(path.name.removesuffix(".journal"))


def path_of(j: KnownObjectJournal) -> Path:
    return Path(j.backend.name)


def records(path: Path) -> list[object]:
    lines = path.read_bytes().splitlines()
    assert orjson.loads(lines[0]) == {"journal": 1, "informer_id": IDENT}
    return [orjson.loads(line) for line in lines[1:]]


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[KnownObjectJournal]:
    checkpoint = Checkpoint(informer_id=IDENT, resource_version="10", objects={"ns/known": ("u-known", "9")})
    j = KnownObjectJournal(backend=file_journal(tmp_path / f"{IDENT}.journal"), informer_id=IDENT)
    assert await j.load(checkpoint) == {}
    task = asyncio.create_task(j.run(), name="journal-under-test")
    try:
        yield j
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_new_objects_and_deletes_wait_for_their_record_updates_of_known_objects_do_not(
    running: KnownObjectJournal,
) -> None:
    j = running
    note(j, 0, NotificationKind.UPDATE, "known", "u-known", "11")  # the checkpoint knows it
    assert not j.must_wait(0)
    note(j, 1, NotificationKind.ADD, "a", "u-a", "12")
    note(j, 2, NotificationKind.UPDATE, "a", "u-a", "13")  # known now (journalled)
    note(j, 3, NotificationKind.DELETE, "known", "u-known", "14")
    note(j, 4, NotificationKind.DELETE, "gone", "u-gone", "9", tombstone=True, inferred=True)
    assert j.must_wait(1)
    assert j.must_wait(4)
    async with asyncio.timeout(5):
        await j.wait(4)
    assert not j.must_wait(4)
    assert records(path_of(j)) == [["a", "ns/a", "u-a", "12"], ["d", "ns/known", "u-known", "14", False],
                               ["d", "ns/gone", "u-gone", "9", True]]


async def test_a_delete_re_sent_as_it_was_sent_keeps_its_marking(running: KnownObjectJournal) -> None:
    """After a restart a relist may report again, as a tombstone, a delete the journal says was sent
    observed: the sinks get it as it was sent (not ``finalstateunknown``, see the pipeline's
    ``delete_is_inferred``), and the journal records that marking, not "inferred" because a tombstone
    carried it — else the next restart re-sends it marked inferred (the contract: the same delete
    again, same marking)."""
    j = running
    note(j, 0, NotificationKind.DELETE, "known", "u-known", "11", tombstone=True, inferred=False)
    async with asyncio.timeout(5):
        await j.wait(0)
    assert records(path_of(j)) == [["d", "ns/known", "u-known", "11", False]]


async def test_a_burst_is_one_group_commit(running: KnownObjectJournal) -> None:
    j = running
    await until(lambda: j.commits > 0, what="the start-up rewrite")
    commits = j.commits
    for i in range(200):
        note(j, i, NotificationKind.ADD, f"o{i}", f"u{i}", str(100 + i))
    async with asyncio.timeout(5):
        await j.wait(199)
    assert j.commits == commits + 1
    assert len(records(path_of(j))) == 200


async def test_compaction_keeps_only_what_the_checkpoint_written_does_not_imply(
    running: KnownObjectJournal,
) -> None:
    j = running
    note(j, 1, NotificationKind.ADD, "a", "u-a", "12")
    note(j, 2, NotificationKind.ADD, "b", "u-b", "13")
    note(j, 3, NotificationKind.DELETE, "known", "u-known", "14")
    note(j, 4, NotificationKind.ADD, "c", "u-c", "15")
    note(j, 5, NotificationKind.DELETE, "c", "u-c", "16")
    async with asyncio.timeout(5):
        await j.wait(5)
    # The next checkpoint knows a (index) and b (ahead), and that known is gone; c's delete (16) is
    # beyond what every sink acknowledged (13): a lagging sink may have c's add and not its delete.
    j.compact(Checkpoint(informer_id=IDENT, resource_version="13", objects={"ns/a": ("u-a", "12")},
                         ahead={"ns/b": ("u-b", "13", False), "ns/known": ("", "14", True)}))
    note(j, 6, NotificationKind.ADD, "d", "u-d", "17")
    async with asyncio.timeout(5):
        await j.wait(6)
    await until(lambda: j._compact_to is None, what="the compaction")
    assert sorted(map(str, records(path_of(j)))) == sorted(map(str, [["d", "ns/c", "u-c", "16", False],
                                                                 ["a", "ns/d", "u-d", "17"]]))
    # Once a checkpoint covers c's delete, its record goes.
    j.compact(Checkpoint(informer_id=IDENT, resource_version="16", objects={"ns/a": ("u-a", "12"),
                                                                            "ns/b": ("u-b", "13")}))
    note(j, 7, NotificationKind.ADD, "e", "u-e", "18")
    async with asyncio.timeout(5):
        await j.wait(7)
    await until(lambda: j._compact_to is None, what="the compaction")
    assert sorted(map(str, records(path_of(j)))) == sorted(map(str, [["a", "ns/d", "u-d", "17"],
                                                                 ["a", "ns/e", "u-e", "18"]]))


async def test_load_ignores_a_torn_tail_and_reports_a_damaged_journal_unreadable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A torn last line is a crash while appending (its events were never released); a bad line
    before the last one, a foreign header or a read error is damage: the records are unknown, and
    ``unreadable`` says so (the pipeline then relists behind a gap marker)."""
    path = tmp_path / "j.journal"
    head = orjson.dumps({"journal": 1, "informer_id": IDENT})
    path.write_bytes(head + b'\n["a","ns/a","u-a","12"]\n["d","ns/a","u-a","13",false]\n["a","ns/b","u-')
    j = KnownObjectJournal(backend=file_journal(path), informer_id=IDENT)
    with caplog.at_level(logging.WARNING, logger="bridge.delivery.journal"):
        assert await j.load(None) == {"u-a": Deleted("ns/a", "13")}
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert j.unreadable == ""
    path.write_bytes(head + b'\n["a","ns/a","u-a","12"]\n["a","ns/b","u-b","abc"]\n["a","ns/c","u-c","14"]\n')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bridge.delivery.journal"):
        assert await j.load(None) == {}
    assert "line 3 is corrupt" in j.unreadable
    assert any("line 3 is corrupt" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    path.write_bytes(orjson.dumps({"journal": 1, "informer_id": "another"}) + b"\n")
    assert await j.load(None) == {}
    assert "not this informer's journal" in j.unreadable
    path.unlink()
    path.mkdir()
    assert await j.load(None) == {}
    assert "IsADirectoryError" in j.unreadable
    path.rmdir()
    assert await j.load(None) == {}
    assert j.unreadable == ""  # none at all: a first start


async def test_a_journal_that_cannot_be_written_holds_its_events_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / f"{IDENT}.journal"
    path.mkdir()  # in the way: the start-up rewrite cannot replace it
    j = KnownObjectJournal(backend=file_journal(path), informer_id=IDENT)
    await j.load(None)
    task = asyncio.create_task(j.run(), name="journal-under-test")
    try:
        note(j, 0, NotificationKind.ADD, "a", "u-a", "12")
        await until(lambda: j.last_error != "", what="the write error")
        assert "IsADirectoryError" in j.last_error
        assert j.must_wait(0)  # the add is held back
        path.rmdir()
        async with asyncio.timeout(10):
            await j.wait(0)  # retried after a second
        assert j.last_error == ""
        assert records(path) == [["a", "ns/a", "u-a", "12"]]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_delete_replayed_after_an_inferred_one_keeps_where_the_held_back_changes_start(
    tmp_path: Path,
) -> None:
    """A restart replays the history of an object whose inferred delete (its state at 12) was sent,
    holding back the changes after 12, and sends the delete the watch shows (at 15). Its record keeps
    12, through a rewrite and a load, so that the replay after another restart holds the same
    changes back; the same delete noted again keeps it too."""
    path = tmp_path / f"{IDENT}.journal"
    checkpoint = Checkpoint(informer_id=IDENT, resource_version="10", objects={"ns/x": ("u-x", "9")})
    first = KnownObjectJournal(backend=file_journal(path), informer_id=IDENT)
    await first.load(checkpoint)
    note(first, 1, NotificationKind.DELETE, "x", "u-x", "12", tombstone=True, inferred=True)
    task = asyncio.create_task(first.run(), name="journal-under-test")
    await first.wait(1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert records(path) == [["d", "ns/x", "u-x", "12", True]]
    for run, seq in (("second", 1), ("third", 1)):
        j = KnownObjectJournal(backend=file_journal(path), informer_id=IDENT)
        loaded = await j.load(checkpoint)
        if run == "second":
            assert loaded == {"u-x": Deleted("ns/x", "12", inferred=True)}
        else:
            assert loaded == {"u-x": Deleted("ns/x", "15", held_after="12")}
        task = asyncio.create_task(j.run(), name="journal-under-test")
        note(j, seq, NotificationKind.DELETE, "x", "u-x", "15")
        await j.wait(seq)
        await j.idle()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert records(path)[-1] == ["d", "ns/x", "u-x", "15", False, "12"]


class HeldJournalFile:
    """A journal file whose first rewrite waits in its thread until ``go`` is set."""

    def __init__(self, path: Path) -> None:
        self.inside, self.go, self.landed = threading.Event(), threading.Event(), threading.Event()
        journal = self

        class Held(FileBlobStore):
            def _replace(self, path: Path, data: bytes) -> None:
                if journal.landed.is_set():
                    super()._replace(path, data)
                    return
                journal.inside.set()
                journal.go.wait()
                try:
                    super()._replace(path, data)
                finally:
                    journal.landed.set()

        self.backend = file_journal(path, Held)


def releasing_journal_file(path: Path, release: threading.Event) -> JournalBackend:
    """A journal file that lets ``release`` go once its first append is durable."""

    class Releasing(FileBlobStore):
        def _append(self, fd: int, data: bytes) -> None:
            super()._append(fd, data)
            release.set()

    return file_journal(path, Releasing)


async def test_a_stopped_writer_ends_only_once_its_write_in_flight_landed(tmp_path: Path) -> None:
    """The pipeline stops a journal's writer by cancelling it (an abort: leadership lost, or the
    random per-sink test's crashes) while a write may be in its thread. The writer's task must end
    only once that write is done: a rewrite landing later would replace the journal that the next
    writer of the same file (the next pipeline in this process) wrote since, and the records it
    made durable — objects sinks then received — would be lost, their deletes with them after the
    next crash (phantoms)."""
    path = tmp_path / f"{IDENT}.journal"
    held = HeldJournalFile(path)
    old = KnownObjectJournal(backend=held.backend, informer_id=IDENT)
    await old.load(None)
    task = asyncio.create_task(old.run(), name="old-journal")
    try:
        await until(held.inside.is_set, what="the start-up rewrite in its thread")
        task.cancel()
        for _ in range(20):
            await asyncio.sleep(0)
        ended_with_its_write_in_flight = task.done()
        if not ended_with_its_write_in_flight:
            held.go.set()  # it waits for its write: let that finish
        await asyncio.gather(task, return_exceptions=True)
        # The next writer starts once the old one ended; its first append lets a write the old
        # one left in flight land.
        new = KnownObjectJournal(backend=releasing_journal_file(path, held.go), informer_id=IDENT)
        await new.load(None)
        new_task = asyncio.create_task(new.run(), name="new-journal")
        try:
            note(new, 0, NotificationKind.ADD, "a", "u-a", "12")
            async with asyncio.timeout(5):
                await new.wait(0)
            await asyncio.to_thread(held.landed.wait, 5)
        finally:
            new_task.cancel()
            await asyncio.gather(new_task, return_exceptions=True)
    finally:
        held.go.set()
    assert records(path) == [["a", "ns/a", "u-a", "12"]]
    assert not ended_with_its_write_in_flight


def gap(j: KnownObjectJournal, seq: int, gap_id: str, since: str, *, end: bool = False) -> None:
    j.note(Notification(kind=NotificationKind.GAP, obj={}, seq=seq,
                        gap=Gap(id=gap_id, from_resource_version=since, end=end)), inferred=False)


async def test_a_relists_states_are_recorded_with_where_its_window_starts_until_a_checkpoint_covers_them(
    running: KnownObjectJournal, tmp_path: Path,
) -> None:
    """Inside a relist's gap (from 10) the states it sends are recorded, for known objects too, with
    the window's start and whether they went out as ``added``: a restart whose watch replays the
    changes the relist coalesced must hold them back. They wait for their record like a new object;
    updates outside the gap do not. A later relist records its own window and keeps the earlier one
    (the change between them was observed one by one: issue 34); a delete of such an object keeps
    the first window's start as where held-back changes start. Each record goes once a checkpoint covers
    the state it names."""
    j = running
    gap(j, 1, "g1", "10")
    note(j, 2, NotificationKind.UPDATE, "known", "u-known", "14")
    assert j.must_wait(2)
    note(j, 3, NotificationKind.ADD, "a", "u-a", "15")
    gap(j, 4, "g1", "10", end=True)
    note(j, 5, NotificationKind.UPDATE, "a", "u-a", "16")  # live, after the gap: known now
    gap(j, 6, "g2", "16")
    note(j, 7, NotificationKind.UPDATE, "a", "u-a", "18")
    note(j, 8, NotificationKind.ADD, "b", "u-b", "19")
    gap(j, 9, "g2", "16", end=True)
    note(j, 10, NotificationKind.DELETE, "b", "u-b", "20")
    async with asyncio.timeout(5):
        await j.wait(10)
    assert not j.must_wait(5)
    assert records(path_of(j)) == [["r", "ns/known", "u-known", "14", "10", False],
                               ["r", "ns/a", "u-a", "15", "10", True],
                               ["r", "ns/a", "u-a", "18", "16", False, [["10", "15", True]]],
                               ["r", "ns/b", "u-b", "19", "16", True],
                               ["d", "ns/b", "u-b", "20", False, "16"]]
    reloaded = await KnownObjectJournal(backend=file_journal(path_of(j)), informer_id=IDENT).load(None)
    assert reloaded["u-a"] == Relisted("ns/a", "18", "16", added=False, earlier=(("10", "15", True),))
    assert reloaded["u-known"] == Relisted("ns/known", "14", "10", added=False)
    # The checkpoint knows every object, and its sinks all acknowledged known's relisted state (its
    # delivered-ahead map) but not a's: a's record stays, so does b's delete.
    j.compact(Checkpoint(informer_id=IDENT, resource_version="13",
                         objects={"ns/known": ("u-known", "9"), "ns/a": ("u-a", "12")},
                         ahead={"ns/known": ("u-known", "14", False), "ns/a": ("u-a", "16", False)}))
    await j.idle()
    assert records(path_of(j)) == [["r", "ns/a", "u-a", "18", "16", False, [["10", "15", True]]],
                               ["d", "ns/b", "u-b", "20", False, "16"]]
    j.compact(Checkpoint(informer_id=IDENT, resource_version="20",
                         objects={"ns/known": ("u-known", "14"), "ns/a": ("u-a", "18")}))
    await j.idle()
    assert records(path_of(j)) == []


async def test_an_inferred_delete_is_kept_until_the_checkpoint_reaches_the_list_that_inferred_it(
    running: KnownObjectJournal,
) -> None:
    """A relist from 10 infers the delete of ``known`` with its last state, 9; its list is at 20. A
    checkpoint still at 10 (a sink had not acknowledged the relist's end) whose index no longer has
    the object keeps the record — 9 is older than 10, yet a watch resumed from 10 replays the
    changes the relist coalesced; one at 20 drops it."""
    j = running
    gap(j, 1, "g", "10")
    note(j, 2, NotificationKind.DELETE, "known", "u-known", "9", tombstone=True, inferred=True)
    j.compact(Checkpoint(informer_id=IDENT, resource_version="10", objects={}))  # before the relist ends
    await j.idle()
    assert records(path_of(j)) == [["d", "ns/known", "u-known", "9", True]]
    j.note(Notification(kind=NotificationKind.GAP, obj={}, seq=3,
                        gap=Gap(id="g", from_resource_version="10", to_resource_version="20", end=True)),
           inferred=False)
    assert j.must_wait(3)
    async with asyncio.timeout(5):
        await j.wait(3)
    assert records(path_of(j))[-1] == ["d", "ns/known", "u-known", "9", True, "", "20"]
    j.compact(Checkpoint(informer_id=IDENT, resource_version="19", objects={}))
    await j.idle()
    assert records(path_of(j)) == [["d", "ns/known", "u-known", "9", True, "", "20"]]
    reloaded = await KnownObjectJournal(backend=file_journal(path_of(j)), informer_id=IDENT).load(None)
    entry = reloaded["u-known"]
    assert isinstance(entry, Deleted)
    assert entry.sent_before == "20"
    j.compact(Checkpoint(informer_id=IDENT, resource_version="20", objects={}))
    await j.idle()
    assert records(path_of(j)) == []


class SmallFiles(FileBlobStore):
    """Files that hold 200 bytes each, like a ConfigMap journal without chunks."""

    def head_room(self, chunks: Sequence[str]) -> int | None:
        return 200


async def test_a_full_journal_releases_a_relists_states_of_known_objects_unrecorded_never_a_new_object(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A relist larger than a bounded journal must not stall for good (nothing would compact it
    meanwhile): its states of objects the durable state knows are released unrecorded, with a
    warning (a crash may then break per-object order, never lose anything); a new object's record
    still waits."""
    path = tmp_path / f"{IDENT}.journal"
    checkpoint = Checkpoint(informer_id=IDENT, resource_version="10",
                            objects={f"ns/k{i}": (f"u-k{i}", "9") for i in range(50)})
    j = KnownObjectJournal(backend=file_journal(path, SmallFiles), informer_id=IDENT)
    await j.load(checkpoint)
    task = asyncio.create_task(j.run(), name="journal-under-test")
    try:
        gap(j, 1, "g", "10")
        for i in range(50):
            note(j, 2 + i, NotificationKind.UPDATE, f"k{i}", f"u-k{i}", str(11 + i))
        with caplog.at_level(logging.WARNING):
            async with asyncio.timeout(5):
                await j.wait(51)
        assert 0 < len(records(path)) < 50
        assert j.skipped == 50 - len(records(path))
        assert "released unrecorded" in caplog.text
        note(j, 52, NotificationKind.ADD, "new", "u-new", "70")  # does not fit: it waits
        await until(lambda: j.write_errors > 0, what="the journal refusing the new object")
        assert j.must_wait(52)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_what_a_sinks_overflow_window_sends_is_recorded_for_that_sink_until_a_checkpoint_covers_it(
    running: KnownObjectJournal, tmp_path: Path,
) -> None:
    """A degraded sink's overflow window sends the latest state per object: each is recorded for that
    sink (its window's ``from``, the state, its type) before it goes out, a second window that
    overlaps keeps the earlier ``from``, a restart reads them per sink, and once a checkpoint covers
    a state its record goes (resume plan invariant 8)."""
    j = running
    seq = j.note_overflowed("k", "u-known", key="ns/known", resource_version="14", since="10",
                            type_="updated")
    async with asyncio.timeout(5):
        await j.wait_recorded(seq)
    assert records(path_of(j)) == [["o", "ns/known", "u-known", "14", "k", "10", "updated"]]
    j.note_overflowed("k", "u-known", key="ns/known", resource_version="16", since="12", type_="deleted")
    j.note_overflowed("other", "u-a", key="ns/a", resource_version="15", since="13", type_="added")
    async with asyncio.timeout(5):
        await j.wait_recorded(j.note_overflowed("k", "u-b", key="ns/b", resource_version="20", since="18",
                                       type_="added"))
    again = KnownObjectJournal(backend=file_journal(path_of(j)), informer_id=IDENT)
    await again.load(None)
    assert again.overflowed == {
        "k": {"u-known": Overflowed("ns/known", "16", "k", "10", "deleted"),
              "u-b": Overflowed("ns/b", "20", "k", "18", "added")},
        "other": {"u-a": Overflowed("ns/a", "15", "other", "13", "added")},
    }
    j.compact(Checkpoint(informer_id=IDENT, resource_version="16", objects={}))
    await until(lambda: j._compact_to is None, what="the compaction")
    assert records(path_of(j)) == [["o", "ns/b", "u-b", "20", "k", "18", "added"]]


def test_an_overflowed_record_that_is_not_one_is_refused() -> None:
    good = ["o", "ns/a", "u-a", "15", "k", "13", "added"]
    assert decode_line(orjson.dumps(good)) == ("u-a", Overflowed("ns/a", "15", "k", "13", "added"))
    for bad in (good[:6], [*good[:4], "", *good[5:]], [*good[:5], "x", good[6]], [*good[:6], "sync"]):
        with pytest.raises((ValueError, TypeError, IndexError)):
            decode_line(orjson.dumps(bad))


async def test_a_full_journal_releases_an_overflow_windows_states_unrecorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Held, an overflow window's record would stall its degraded sink for good: the window holds
    back the checkpoint that would compact the journal. Released unrecorded, with a warning."""
    path = tmp_path / f"{IDENT}.journal"
    j = KnownObjectJournal(backend=file_journal(path, SmallFiles), informer_id=IDENT)
    await j.load(Checkpoint(informer_id=IDENT, resource_version="10", objects={}))
    task = asyncio.create_task(j.run(), name="journal-under-test")
    try:
        last = 0
        for i in range(50):
            last = j.note_overflowed("k", f"u{i}", key=f"ns/o{i}", resource_version=str(11 + i),
                                     since="10", type_="updated")
        with caplog.at_level(logging.WARNING):
            async with asyncio.timeout(5):
                await j.wait_recorded(last)
        assert 0 < len(records(path)) < 50
        assert j.skipped == 50 - len(records(path))
        assert "released unrecorded" in caplog.text
        assert len(j.overflowed["k"]) == len(records(path))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
