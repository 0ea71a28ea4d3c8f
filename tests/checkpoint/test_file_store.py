"""The checkpoint encoding, informer ids and the file store (atomic replace, corruption)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from bridge.storage.blob_file import FileBlobStore
from bridge.storage.checkpoint import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointStoreError,
    FileCheckpointStore,
    SinkProgress,
    decode_checkpoint,
    encode_checkpoint,
    informer_id,
)
from tests.checkpoint.helpers import until

CP = Checkpoint(
    informer_id="pods.default.abc",
    resource_version="42",
    objects={"default/a": ("u1", "40"), "default/b": ("u2", "42")},
    written_at=1_700_000_123.5,
)


def test_informer_id_is_stable_safe_and_scope_specific() -> None:
    a = informer_id("pods", "default", "app=x", "")
    assert a == informer_id("pods", "default", "app=x", "")
    assert a.startswith("pods.default.")
    assert len(a.split(".")[-1]) == 12
    assert informer_id("pods", "default", "app=y", "") != a
    assert informer_id("pods", "", "", "").startswith("pods.all.")
    ident = informer_id("deployments.apps", "Kube_System/..", "", "")
    assert ident.startswith("deployments.apps.kube-system.")
    for ident in (a, informer_id("x/y", "../etc", "a in (b)", "c!=d")):
        assert all(c.isalnum() or c in ".-" for c in ident)
        assert "/" not in ident


def test_encode_decode_roundtrip() -> None:
    assert decode_checkpoint(encode_checkpoint(CP), "pods.default.abc") == CP


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:-3], "truncated"),
        (lambda b: b.replace(b'"42"', b'"43"'), "checksum mismatch"),
        (lambda b: b"garbage", "bad header"),
        (lambda b: b"", "bad header"),
        (lambda b: b.replace(b"checkpoint %d " % FORMAT_VERSION, b"checkpoint 9 "),
         "format 9 is not supported"),
    ],
)
def test_decode_rejects_damage(mutate: Callable[[bytes], bytes], message: str) -> None:
    with pytest.raises(CheckpointCorruptError, match=message):
        decode_checkpoint(mutate(encode_checkpoint(CP)))


def test_decode_rejects_another_informers_checkpoint() -> None:
    with pytest.raises(CheckpointCorruptError, match="belongs to informer"):
        decode_checkpoint(encode_checkpoint(CP), "nodes.all.x")


async def test_file_store_save_load_replace(tmp_path: Path) -> None:
    store = FileCheckpointStore(directory=tmp_path / "ckpt")
    assert await store.load(CP.informer_id) is None
    await store.save(CP)
    assert await store.load(CP.informer_id) == CP
    newer = Checkpoint(informer_id=CP.informer_id, resource_version="50", objects={}, written_at=2.0)
    await store.save(newer)
    assert await store.load(CP.informer_id) == newer
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["pods.default.abc.ckpt"]
    await store.close()


async def test_file_store_corrupt_and_unreadable(tmp_path: Path) -> None:
    store = FileCheckpointStore(directory=tmp_path)
    await store.save(CP)
    path = store.path_for(CP.informer_id)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointCorruptError, match="truncated"):
        await store.load(CP.informer_id)
    path.unlink()
    path.mkdir()  # reading a directory fails with an OSError
    with pytest.raises(CheckpointCorruptError, match="cannot read"):
        await store.load(CP.informer_id)


def test_file_store_refuses_unsafe_ids(tmp_path: Path) -> None:
    store = FileCheckpointStore(directory=tmp_path)
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="unsafe"):
            store.path_for(bad)


async def test_failed_write_leaves_previous_checkpoint(tmp_path: Path) -> None:
    store = FileCheckpointStore(directory=tmp_path)
    await store.save(CP)
    # Block the temporary file's name with a directory: the write fails before the rename.
    blocker = tmp_path / f".pods.default.abc.ckpt.{os.getpid()}.tmp"
    blocker.mkdir()
    with pytest.raises(CheckpointStoreError, match="cannot write"):
        await store.save(Checkpoint(informer_id=CP.informer_id, resource_version="99"))
    assert await store.load(CP.informer_id) == CP


async def test_directory_that_is_a_file_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    store = FileCheckpointStore(directory=tmp_path / "f")
    with pytest.raises(CheckpointStoreError, match="cannot write"):
        await store.save(CP)


def test_roundtrip_keeps_the_delivered_ahead_map() -> None:
    cp = Checkpoint(informer_id="pods.default.abc", resource_version="42",
                    objects={"default/a": ("u1", "40")},
                    ahead={"default/a": ("u1", "45", False), "default/b": ("", "44", True)})
    back = decode_checkpoint(encode_checkpoint(cp))
    assert back.ahead == {"default/a": ("u1", "45", False), "default/b": ("", "44", True)}
    assert back == cp


def _sealed(body: dict[str, object], version: int = 1) -> bytes:
    """A checkpoint whose header (length, checksum) is right for ``body``, whatever it holds."""
    raw = orjson.dumps(body)
    return b"kube-event-bridge-checkpoint %d %d %s\n%s" % (
        version, len(raw), hashlib.sha256(raw).hexdigest().encode(), raw)


_GOOD: dict[str, object] = {"informer_id": "x", "resource_version": "42", "written_at": 1.0,
                            "objects": {"ns/a": ["u-a", "40"]}, "ahead": {"ns/b": ["u-b", "43", False]}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"resource_version": "abc"}, "resourceVersion 'abc'"),
        ({"resource_version": "-5"}, "resourceVersion '-5'"),
        ({"resource_version": 42}, "resourceVersion 42"),
        ({"objects": {"ns/a": ["", "40"]}}, "'ns/a' has no uid"),
        ({"objects": {"ns/a": [None, "40"]}}, "'ns/a' has no uid"),
        ({"objects": {"ns/a": ["u-a", "forty"]}}, "'ns/a' has resourceVersion 'forty'"),
        ({"objects": {"": ["u-a", "40"]}}, "empty key"),
        ({"objects": {"a/b/c": ["u-a", "40"]}}, "key 'a/b/c'"),
        ({"objects": ["ns/a"]}, "malformed"),
        ({"ahead": {"ns/b": ["", "43", False]}}, "'ns/b' has no uid"),
        ({"ahead": {"ns/b": ["u-b", "x", False]}}, "'ns/b' has resourceVersion 'x'"),
        ({"ahead": {"ns/b": ["u-b", "43", "no"]}}, "'ns/b'"),
        ({"written_at": "soon"}, "malformed"),
    ],
)
def test_decode_rejects_nonsense_behind_a_valid_checksum(change: dict[str, object], message: str) -> None:
    assert decode_checkpoint(_sealed(_GOOD)).resource_version == "42"  # the unchanged body is fine
    with pytest.raises(CheckpointCorruptError, match=re.escape(message)):
        decode_checkpoint(_sealed({**_GOOD, **change}))


def test_a_deleted_ahead_entry_needs_no_uid() -> None:
    cp = decode_checkpoint(_sealed({**_GOOD, "ahead": {"ns/b": ["", "43", True]}}))
    assert cp.ahead == {"ns/b": ("", "43", True)}


# --------------------------------------------------------------------------------------------------
# Per-sink progress (format 2)


def test_roundtrip_keeps_the_per_sink_section_compact() -> None:
    cp = Checkpoint(informer_id="pods.default.abc", resource_version="42",
                    objects={"default/a": ("u1", "40"), "default/b": ("u2", "41")},
                    sinks={"kafka": SinkProgress(),
                           "fast": SinkProgress(resource_version="50",
                                                objects={"default/a": ("u1", "48"), "default/b": None,
                                                         "default/c": ("u3", "49")},
                                                ahead={"default/d": ("u4", "51", False)})})
    data = encode_checkpoint(cp)
    assert b'"kafka":{}' in data  # a sink at the base costs its name
    assert decode_checkpoint(data) == cp


def test_a_format_1_checkpoint_loads_as_every_sink_at_the_base() -> None:
    cp = decode_checkpoint(_sealed(_GOOD, version=1))
    assert cp.sinks is None  # the pipeline reads it as: every configured sink, at the base
    assert cp.format_version == 1
    # A format-1 body never has a per-sink section, even if it held one.
    assert decode_checkpoint(_sealed({**_GOOD, "sinks": {"x": {}}}, version=1)).sinks is None
    assert decode_checkpoint(_sealed({**_GOOD, "sinks": {"x": {}}}, version=2)).sinks == {"x": SinkProgress()}


@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        (["kafka"], "per-sink section is malformed"),
        ({"kafka": []}, "per-sink section 'kafka' is malformed"),
        ({"": {}}, "per-sink section '' is malformed"),
        ({"kafka": {"rv": "1"}}, "unknown fields ['rv']"),
        ({"kafka": {"resource_version": "x"}}, "sink 'kafka': resourceVersion 'x'"),
        ({"kafka": {"resource_version": "41"}}, "sink 'kafka': resourceVersion 41 is behind the base's 42"),
        ({"kafka": {"objects": {"ns/a": ["", "40"]}}}, "sink 'kafka': known object 'ns/a' has no uid"),
        ({"kafka": {"objects": {"ns/a": ["u", "4x"]}}}, "sink 'kafka': known object 'ns/a' has resource"),
        ({"kafka": {"objects": {"a/b/c": None}}}, "key 'a/b/c'"),
        ({"kafka": {"ahead": {"ns/b": ["", "43", False]}}}, "delivered-ahead entry 'ns/b' has no"),
        ({"kafka": {"ahead": {"ns/b": ["u", "43"]}}}, "sink 'kafka': delivered-ahead entry 'ns/b' is malf"),
    ],
)
def test_decode_rejects_a_nonsense_per_sink_section(sinks: object, message: str) -> None:
    assert decode_checkpoint(_sealed({**_GOOD, "sinks": {"kafka": {}}}, 2)).sinks == {"kafka": SinkProgress()}
    with pytest.raises(CheckpointCorruptError, match=re.escape(message)):
        decode_checkpoint(_sealed({**_GOOD, "sinks": sinks}, 2))


class HeldFileStore(FileCheckpointStore):
    """A file store whose first save waits in its thread until ``go`` is set."""

    def __init__(self, directory: Path) -> None:
        self.inside, self.go, self.landed = threading.Event(), threading.Event(), threading.Event()
        store = self

        class Held(FileBlobStore):
            def _replace(self, path: Path, data: bytes) -> None:
                if store.landed.is_set():
                    super()._replace(path, data)
                    return
                store.inside.set()
                store.go.wait()
                try:
                    super()._replace(path, data)
                finally:
                    store.landed.set()

        super().__init__(directory=directory, files=Held)


class ReleasingFileStore(FileCheckpointStore):
    """A file store that lets ``release`` go once its first save is written."""

    def __init__(self, directory: Path, release: threading.Event) -> None:
        class Releasing(FileBlobStore):
            def _replace(self, path: Path, data: bytes) -> None:
                super()._replace(path, data)
                release.set()

        super().__init__(directory=directory, files=Releasing)


async def test_a_cancelled_save_returns_only_once_its_write_landed(tmp_path: Path) -> None:
    """A checkpoint write cancelled mid-way (the pipeline's abort stops the checkpoint writer)
    returns only once its file is written: landing later, it would replace a newer checkpoint the
    next pipeline in this process wrote since — one whose known-object journal was compacted
    against the newer one, so the objects between the two would be known to neither."""
    held = HeldFileStore(tmp_path)
    older = Checkpoint(informer_id=CP.informer_id, resource_version="40")
    save = asyncio.create_task(held.save(older))
    try:
        await until(held.inside.is_set, what="the save in its thread")
        save.cancel()
        for _ in range(20):
            await asyncio.sleep(0)
        returned_with_its_write_in_flight = save.done()
        if not returned_with_its_write_in_flight:
            held.go.set()  # it waits for its write: let that finish
        await asyncio.gather(save, return_exceptions=True)
        # The next writer saves once the cancelled save returned; that lets a write the cancelled
        # save left in flight land.
        await ReleasingFileStore(tmp_path, held.go).save(CP)
        await asyncio.to_thread(held.landed.wait, 5)
    finally:
        held.go.set()
    assert await FileCheckpointStore(directory=tmp_path).load(CP.informer_id) == CP
    assert not returned_with_its_write_in_flight
