"""Checkpoints and journals written by the stores before the storage layer was unified still load:
the bytes, ConfigMaps and KV values here are laid out by hand exactly as those stores wrote them
(file, ConfigMap inline and sharded, NATS KV manifest and chunks, each with a journal spanning a
sealed chunk), then read, claimed and overwritten by today's stores."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest

from bridge.delivery.journal import Deleted, Exists, KnownObjectJournal, Relisted
from bridge.kube.apiclient import ApiClient
from bridge.kube.leaderelection import FenceToken
from bridge.sim import Simulator
from bridge.storage.checkpoint import (
    FORMAT_VERSION,
    BlobCheckpointStore,
    Checkpoint,
    CheckpointFencedError,
    CheckpointStore,
    FileCheckpointStore,
    SinkProgress,
)
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore, live_keys
from tests.brokers import NatsServer, running_nats
from tests.checkpoint.test_fencing import Term

IDENT = "configmaps.compat.0123456789ab"
A = FenceToken(transitions=0, holder="a")
B = FenceToken(transitions=1, holder="b")
OBJECTS = {f"ns/objet-é-{i:04d}": (f"uid-{i:04d}", str(1000 + i)) for i in range(60)}
WANT = Checkpoint(informer_id=IDENT, resource_version="2000", objects=OBJECTS, written_at=7.5,
                  ahead={"ns/late": ("uid-late", "2005", False)}, writer=A, format_version=2)
RECORDS = [["a", f"ns/new-{i}", f"uid-new-{i}", str(2001 + i)] for i in range(30)] + [
    ["d", "ns/objet-é-0001", "uid-0001", "2040", False]]
ENTRIES = {**{f"uid-new-{i}": Exists(f"ns/new-{i}", str(2001 + i)) for i in range(30)},
           "uid-0001": Deleted("ns/objet-é-0001", "2040")}


def old_checkpoint_bytes() -> bytes:
    """An encoded checkpoint, header and body laid out by hand as format 2 was written."""
    body = orjson.dumps({
        "informer_id": IDENT, "resource_version": "2000", "written_at": 7.5,
        "objects": {k: [u, rv] for k, (u, rv) in OBJECTS.items()},
        "ahead": {"ns/late": ["uid-late", "2005", False]}, "writer": [0, "a"],
    })
    digest = hashlib.sha256(body).hexdigest().encode()
    return b"kube-event-bridge-checkpoint 2 %d %s\n%s" % (len(body), digest, body)


def old_journal_bytes() -> bytes:
    lines = [orjson.dumps({"journal": 1, "informer_id": IDENT}), *(orjson.dumps(r) for r in RECORDS)]
    return b"\n".join(lines) + b"\n"


async def loads_claims_and_fences(make: Any) -> None:
    """A successor's store (term 1) loads the old checkpoint and its journal, which claims it; the
    old leader's store is refused from then on; the successor writes and reads back."""
    new: CheckpointStore = make(Term(B))
    loaded = await new.load(IDENT)
    assert loaded is not None
    assert loaded.objects == WANT.objects
    assert (loaded.resource_version, loaded.ahead, loaded.written_at) == ("2000", WANT.ahead, 7.5)
    journal = KnownObjectJournal(backend=new.journal_backend(IDENT), informer_id=IDENT)  # type: ignore[attr-defined]
    assert await journal.load(loaded) == ENTRIES
    with pytest.raises(CheckpointFencedError):
        await make(Term(A)).save(WANT)
    newer = Checkpoint(informer_id=IDENT, resource_version="3000", objects=OBJECTS, written_at=8.0)
    await new.save(newer)
    again = await make(Term(B)).load(IDENT)
    assert again is not None
    assert (again.resource_version, again.objects, again.writer) == ("3000", OBJECTS, B)


async def test_a_file_checkpoint_and_journal_of_the_previous_stores_load(tmp_path: Path) -> None:
    (tmp_path / f"{IDENT}.ckpt").write_bytes(old_checkpoint_bytes())
    (tmp_path / f"{IDENT}.journal").write_bytes(old_journal_bytes())
    assert await FileCheckpointStore(directory=tmp_path).peek(IDENT) == WANT
    await loads_claims_and_fences(
        lambda term: FileCheckpointStore(directory=tmp_path, fsync=False, fence=term))


def labels(role: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "kube-event-bridge",
            "kube-event-bridge.io/checkpoint": hashlib.sha256(IDENT.encode()).hexdigest()[:40],
            "kube-event-bridge.io/checkpoint-role": role}


def configmap(name: str, role: str, data: dict[str, str], token: FenceToken | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels(role)}
    if token is not None:
        metadata["annotations"] = {"kube-event-bridge.io/writer": token.holder,
                                   "kube-event-bridge.io/lease-transitions": str(token.transitions)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def pieces(text: str, n: int) -> list[str]:
    size = -(-len(text) // n)
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("sharded", [False, True], ids=["inline", "sharded"])
async def test_configmap_checkpoints_and_journals_of_the_previous_stores_load(sharded: bool) -> None:
    sim = Simulator()
    await sim.start()
    client = ApiClient(server=sim.url)
    cms = "/api/v1/namespaces/default/configmaps"
    try:
        encoded = old_checkpoint_bytes()
        manifest = f"keb-{IDENT}"
        if sharded:
            shards = [f"{manifest}-s0a1b2c3d4e-{n}" for n in range(3)]
            for name, piece in zip(shards, pieces(encoded.decode(), 3), strict=True):
                await client.create(cms, configmap(name, "shard", {"chunk": piece}))
            data = {"format": "1", "shards": ",".join(shards), "size": str(len(encoded)),
                    "sha256": hashlib.sha256(encoded).hexdigest()}
        else:
            data = {"format": "1", "checkpoint": encoded.decode()}
        await client.create(cms, configmap(manifest, "manifest", data, A))
        journal = old_journal_bytes().decode()
        cut = journal.index("\n", len(journal) // 2) + 1
        chunk = f"{manifest}-journal-c9f8e7d6c5b-0"
        await client.create(cms, configmap(chunk, "journal-chunk", {"chunk": journal[:cut]}))
        await client.create(cms, configmap(f"{manifest}-journal", "journal",
                                           {"journal": journal[cut:], "chunks": chunk}, A))

        def make(term: Term) -> ConfigMapCheckpointStore:
            return ConfigMapCheckpointStore(client=client, namespace="default", name_prefix="keb",
                                            shard_bytes=4096, fence=term)

        assert await ConfigMapCheckpointStore(client=client, namespace="default",
                                              name_prefix="keb").peek(IDENT) == WANT
        await loads_claims_and_fences(make)
        if sharded:  # the old generation's shards go once a new manifest no longer lists them
            names = {i["metadata"]["name"] for i in (await client.get(cms))["items"]}
            assert not names & set(shards)
    finally:
        await client.close()
        await sim.stop()


@pytest.fixture(scope="module")
def nats_js() -> Iterator[NatsServer]:
    with running_nats() as server:
        yield server


async def test_nats_kv_checkpoints_and_journals_of_the_previous_stores_load(nats_js: NatsServer) -> None:
    nc = await nats.connect(nats_js.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="compat", history=1)
        encoded = old_checkpoint_bytes()
        size = -(-len(encoded) // 3)
        for n in range(3):
            await kv.put(f"{IDENT}.c.0a1b2c3d4e5f.{n}", encoded[n * size:(n + 1) * size])
        await kv.put(IDENT, orjson.dumps({"generation": "0a1b2c3d4e5f", "chunks": 3, "size": len(encoded),
                                          "sha256": hashlib.sha256(encoded).hexdigest(), "writer": [0, "a"]}))
        journal = old_journal_bytes()
        cut = journal.index(b"\n", len(journal) // 2) + 1
        chunk = f"{IDENT}.journal.c.9f8e7d6c5b.0"
        await kv.put(chunk, journal[:cut])
        await kv.put(f"{IDENT}.journal",
                     orjson.dumps({"writer": [0, "a"], "chunks": [chunk]}) + b"\n" + journal[cut:])
        peeking = NatsKvCheckpointStore(nc=nc, bucket="compat")
        assert await peeking.peek(IDENT) == WANT
        await loads_claims_and_fences(lambda term: NatsKvCheckpointStore(nc=nc, bucket="compat", fence=term))
        keys = await live_keys(kv)
        assert not [k for k in keys if k.startswith(f"{IDENT}.c.0a1b2c3d4e5f.")]  # the old generation went
    finally:
        await nc.close()


# --------------------------------------------------------------------------------------------------
# What the stores at commit 3c23339 wrote, as they wrote it (tests/checkpoint/data/stored_formats.json:
# the files, the ConfigMaps and the NATS KV keys of a sharded checkpoint with per-sink sections, its
# journal of every record shape, sealed chunks included, and a small checkpoint), loaded by today's.

FORMATS: dict[str, Any] = orjson.loads((Path(__file__).parent / "data" / "stored_formats.json").read_bytes())
GOLDEN, SMALL = "configmaps.golden.0123456789ab", "configmaps.small.0123456789ab"
WRITER = FenceToken(transitions=3, holder="bridge-0")
SUCCESSOR = FenceToken(transitions=4, holder="bridge-1")
GOLDEN_CP = Checkpoint(
    informer_id=GOLDEN, resource_version="2000", written_at=7.5, writer=WRITER, format_version=2,
    objects={f"ns/objet-é-{i:04d}": (f"uid-{i:04d}", str(1000 + i)) for i in range(40)},
    ahead={"ns/late": ("uid-late", "2005", False), "ns/gone": ("", "2006", True)},
    sinks={"kafka": SinkProgress(), "webhook": SinkProgress(
        resource_version="2004", objects={"ns/objet-é-0001": None, "ns/new": ("uid-new", "2002")},
        ahead={"ns/late": ("uid-late", "2005", False)})})
SMALL_CP = Checkpoint(informer_id=SMALL, resource_version="17", objects={"a/b": ("u", "3")}, written_at=1.0,
                      writer=WRITER, format_version=2)
GOLDEN_ENTRIES = {
    **{f"uid-n-{i}": Exists(f"ns/n-{i}", str(2001 + i)) for i in range(45)},
    "uid-r": Relisted("ns/r", "2030", "1990", added=False),
    "uid-0001": Deleted("ns/objet-é-0001", "2040"),
    "uid-0002": Deleted("ns/objet-é-0002", "2041", inferred=True, held_after="1995"),
    "uid-0003": Deleted("ns/objet-é-0003", "2042", inferred=True, sent_before="2045"),
    "uid-0004": Deleted("ns/objet-é-0004", "2043", inferred=True, held_after="1996", sent_before="2046"),
}


async def reads_what_3c23339_wrote(store: BlobCheckpointStore, successor: BlobCheckpointStore) -> None:
    assert await store.peek(GOLDEN) == GOLDEN_CP
    assert await store.peek(SMALL) == SMALL_CP
    journal = KnownObjectJournal(backend=store.journal_backend(GOLDEN), informer_id=GOLDEN)
    assert await journal.load(None) == GOLDEN_ENTRIES
    claimed = await successor.load(GOLDEN)  # a later leader's load claims it
    assert claimed is not None
    assert claimed == GOLDEN_CP
    # The claim rewrote it in today's format.
    rewritten = dataclasses.replace(GOLDEN_CP, writer=SUCCESSOR, format_version=FORMAT_VERSION)
    assert await store.peek(GOLDEN) == rewritten


async def test_files_written_by_3c23339_load(tmp_path: Path) -> None:
    for name, text in FORMATS["file"].items():
        (tmp_path / name).write_text(text)
    successor = FileCheckpointStore(directory=tmp_path, fsync=False, fence=Term(SUCCESSOR))
    await reads_what_3c23339_wrote(FileCheckpointStore(directory=tmp_path), successor)


async def test_configmaps_written_by_3c23339_load() -> None:
    sim = Simulator()
    await sim.start()
    client = ApiClient(server=sim.url)
    try:
        for cm in FORMATS["configmap"]:
            metadata = {"name": cm["name"], "labels": cm["labels"], "annotations": cm["annotations"]}
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": cm["data"]}
            await client.create("/api/v1/namespaces/default/configmaps", body)
        successor = ConfigMapCheckpointStore(client=client, namespace="default", name_prefix="keb",
                                             fence=Term(SUCCESSOR))
        await reads_what_3c23339_wrote(
            ConfigMapCheckpointStore(client=client, namespace="default", name_prefix="keb"), successor)
    finally:
        await client.close()
        await sim.stop()


async def test_nats_kv_values_written_by_3c23339_load(nats_js: NatsServer) -> None:
    nc = await nats.connect(nats_js.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="golden", history=1)
        for key, value in FORMATS["natskv"].items():
            await kv.put(key, value.encode())
        await reads_what_3c23339_wrote(NatsKvCheckpointStore(nc=nc, bucket="golden"),
                                       NatsKvCheckpointStore(nc=nc, bucket="golden", fence=Term(SUCCESSOR)))
    finally:
        await nc.close()


# Format 3 (FORMAT_VERSION 3: a sink's ``owes``, per earlier object of a re-used name the changes it
# owes), as the file store wrote it (stored_formats.json, "format3").
OWES_CP = Checkpoint(
    informer_id="configmaps.owes.0123456789ab", resource_version="30", written_at=2.5, writer=WRITER,
    objects={"ns/d": ("u-d", "15")},
    sinks={"kafka": SinkProgress(), "webhook": SinkProgress(
        resource_version="31", objects={"ns/e": ("u-e", "32")},
        ahead={"ns/d": ("u-d3", "36", False), "ns/e": ("u-e2", "34", False)},
        owes={"ns/d": {"u-d": "33", "u-d2": "35"}})})


async def test_a_format_3_file_with_what_a_sink_owes_of_several_earlier_objects_loads(tmp_path: Path) -> None:
    for name, text in FORMATS["format3"]["file"].items():
        (tmp_path / name).write_text(text)
    loaded = await FileCheckpointStore(directory=tmp_path).peek(OWES_CP.informer_id)
    assert loaded == OWES_CP
    assert loaded.format_version == 3
    assert loaded.sinks is not None
    # ns/d: two earlier objects owed (owes); ns/e: one (in both maps under different uids, as format 2).
    assert loaded.sinks["webhook"].owed_deletes() == frozenset({"u-d", "u-d2", "u-e"})
