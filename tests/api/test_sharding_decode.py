"""Sharding by object at the decode step (bridge/kube/sharding.py): a watch line of an object this
shard does not own becomes a bookmark at its resourceVersion, decoded no further; a list item not
owned is dropped before it is decoded; floors skip changes a previous owner already delivered."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.contracts import WatchEventType
from bridge.kube.listwatch import WatchDecodeError, decode_watch_event, raw_object_decoder
from bridge.kube.sharding import _API_LAYOUT, ShardFilter, shard_of, shard_residue, sharded_decoder

UIDS = [f"0000{i:04d}-7b9e-4c43-9a54-2d1f0b7c9e11" for i in range(200)]


def line(type_: str, uid: str, rv: str, name: str = "x") -> bytes:
    return orjson.dumps({"type": type_, "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv}, "data": {"k": "v" * 50}}})


def test_ownership_is_a_partition_and_spreads() -> None:
    for total in (2, 3, 8):
        counts = [0] * total
        for uid in UIDS:
            owners = [o for o in range(total) if ShardFilter(ordinal=o, total=total).owns(uid)]
            assert owners == [shard_of(uid, total)]
            counts[owners[0]] += 1
        assert min(counts) >= len(UIDS) // total // 2, counts  # no shard starved
    for uid in UIDS:
        assert shard_residue(uid, 12) % 3 == shard_of(uid, 3)
        assert shard_residue(uid, 12) % 4 == shard_of(uid, 4)


def test_the_hash_is_stable() -> None:
    """Every process, every Python, every release must agree: blake2b of the uid, not hash()."""
    assert [shard_of(u, 7) for u in UIDS[:10]] == [0, 6, 6, 0, 2, 1, 5, 3, 0, 3]


@pytest.mark.parametrize("decode", [decode_watch_event, raw_object_decoder(drop_managed_fields=True)])
@pytest.mark.parametrize("type_", ["ADDED", "MODIFIED", "DELETED"])
def test_foreign_events_become_bookmarks(decode: object, type_: str) -> None:
    mine = next(u for u in UIDS if shard_of(u, 3) == 1)
    theirs = next(u for u in UIDS if shard_of(u, 3) == 2)
    shard = ShardFilter(ordinal=1, total=3)
    dec = sharded_decoder(decode, shard)  # type: ignore[arg-type]
    kept = dec(line(type_, mine, "17"))
    assert kept.type.value == type_
    assert kept.object["metadata"]["uid"] == mine
    skipped = dec(line(type_, theirs, "18"))
    assert skipped.type is WatchEventType.BOOKMARK
    assert skipped.object == {"metadata": {"resourceVersion": "18"}}
    assert shard.skipped == 1


def test_bookmarks_errors_and_garbage_go_to_the_decoder() -> None:
    dec = sharded_decoder(decode_watch_event, ShardFilter(ordinal=1, total=3))
    bm = dec(b'{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"9",'
             b'"annotations":{"k8s.io/initial-events-end":"true"}}}}')
    assert bm.object["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    err = dec(b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}')
    assert err.type is WatchEventType.ERROR
    assert err.object["code"] == 410
    with pytest.raises(WatchDecodeError):
        dec(b'{"type":"ADDED","object":')


def test_floors_skip_what_a_previous_owner_delivered() -> None:
    shard = ShardFilter(ordinal=0, total=2)
    mine = [u for u in UIDS if shard_of(u, 2) == 0][:20]
    # Residues modulo 4 (the old total): those of old shard 1 were delivered up to 100, of 3 up to 50.
    shard.set_floors(4, {r: (100 if r % 4 == 1 else 50 if r % 4 == 3 else 0) for r in range(4)})
    dec = sharded_decoder(decode_watch_event, shard)
    for uid in mine:
        floor = {0: 0, 1: 100, 2: 0, 3: 50}[shard_residue(uid, 4)]
        for rv in (40, 60, 100, 101):
            ev = dec(line("MODIFIED", uid, str(rv)))
            expect_kept = rv > floor
            assert (ev.type is WatchEventType.MODIFIED) == expect_kept, (uid, rv, floor)
    with pytest.raises(ValueError, match="multiple"):
        shard.set_floors(3, {})


def test_list_items_are_filtered_from_their_identity_only() -> None:
    shard = ShardFilter(ordinal=0, total=2)
    items = [orjson.dumps({"metadata": {"name": f"n{i}", "uid": u}}) for i, u in enumerate(UIDS[:40])]
    kept = [i for i in items if shard.keeps_item(i)]
    assert {orjson.loads(i)["metadata"]["uid"] for i in kept} == {u for u in UIDS[:40] if shard_of(u, 2) == 0}
    assert shard.skipped == 40 - len(kept)


def test_one_shard_without_floors_decodes_as_without_sharding() -> None:
    """A resource watched whole by one replica (``sharding: resource``, or ``shards: 1``) pays no
    identity pass; a take-over's floors turn it on."""
    calls: list[bytes] = []

    def decode(raw: bytes) -> object:
        calls.append(raw)
        return decode_watch_event(raw)

    shard = ShardFilter(ordinal=0, total=1)
    dec = sharded_decoder(decode, shard)  # type: ignore[arg-type]
    assert not shard.filtering
    assert dec(line("MODIFIED", UIDS[0], "5")).type is WatchEventType.MODIFIED
    shard.set_floors(2, {0: 9, 1: 9})
    assert shard.filtering
    assert dec(line("MODIFIED", UIDS[0], "5")).type is WatchEventType.BOOKMARK
    assert dec(line("MODIFIED", UIDS[0], "10")).type is WatchEventType.MODIFIED
    assert shard.keeps_item(orjson.dumps({"metadata": {"uid": UIDS[1]}}))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def _watch_lines(draw: st.DrawFn) -> bytes:
    """Watch lines of arbitrary objects: names, namespaces, uids (absent, empty, any text, the
    ones of an owner reference), resourceVersions, labels with a ``uid`` key, and other members
    anywhere around the metadata (Hypothesis property below)."""
    meta: dict[str, object] = {}
    for key, values in (("name", st.text(max_size=10)), ("namespace", st.text(max_size=10)),
                        ("uid", st.sampled_from(UIDS[:8]) | st.text(max_size=12)),
                        ("resourceVersion", st.integers(0, 10**6).map(str) | st.text(max_size=5))):
        if draw(st.booleans()):
            meta[key] = draw(values)
    if draw(st.booleans()):
        meta["labels"] = draw(st.dictionaries(st.sampled_from(["uid", "app", "resourceVersion"]),
                                              st.sampled_from(UIDS[:8]) | st.text(max_size=6), max_size=3))
    if draw(st.booleans()):
        meta["ownerReferences"] = [{"uid": draw(st.sampled_from(UIDS[:8])), "kind": "ReplicaSet"}]
    if draw(st.booleans()):  # an API server's order (Go's field order): the fast path's layout
        meta.setdefault("uid", draw(st.sampled_from(UIDS[:8])))
        meta.setdefault("resourceVersion", str(draw(st.integers(0, 1000))))
        order: list[str] = [k for k in ("name", "namespace", "uid", "resourceVersion", "labels",
                                        "ownerReferences") if k in meta]
    else:
        order = draw(st.permutations(list(meta)))
    obj: dict[str, object] = {"kind": "Pod", "apiVersion": "v1", "metadata": {k: meta[k] for k in order}}
    members = st.dictionaries(st.sampled_from(["spec", "status", "data", "uid"]), _json, max_size=3)
    obj.update(draw(members))
    type_ = draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]))
    event = {"type": type_, "object": obj} if draw(st.integers(0, 3)) else {"object": obj, "type": type_}
    return orjson.dumps(event)


@given(line=_watch_lines(), total=st.integers(1, 5), ordinal=st.integers(0, 4), floors=st.booleans())
@settings(max_examples=1000, deadline=None)
def test_a_skipped_line_is_what_the_full_decode_would_skip(line: bytes, total: int, ordinal: int,
                                                          floors: bool) -> None:
    """The identity pass decides as the full decode of the same line: its uid and resourceVersion
    are the object's metadata's (never an owner reference's, a label's or a nested member's), and a
    bookmark or error always goes to the decoder."""
    shard = ShardFilter(ordinal=ordinal % total, total=total)
    if floors:
        shard.set_floors(total * 2, {r: 500 for r in range(0, total * 2, 2)})
    full = decode_watch_event(line)
    meta = full.object.get("metadata") or {}
    uid, rv = meta.get("uid") or "", meta.get("resourceVersion") or ""
    expect_skip = (shard.filtering and full.type not in (WatchEventType.BOOKMARK, WatchEventType.ERROR)
                   and not shard.keeps_event(uid, rv))
    got = shard.skip_line(line)
    assert (got is not None) == expect_skip, (got, _API_LAYOUT.match(line))
    if expect_skip:
        assert got == rv
        bookmark = sharded_decoder(decode_watch_event, shard)(line)
        assert bookmark.object == {"metadata": {"resourceVersion": rv}}


def test_a_line_in_the_api_servers_layout_is_judged_from_its_first_bytes() -> None:
    """Go's field order puts the uid and resourceVersion among the first bytes of a watch line: they
    are read there, not by a pass over the whole line (what follows is not read at all); any other
    layout takes the msgspec pass."""
    theirs = next(u for u in UIDS if shard_of(u, 2) == 0)
    mine = next(u for u in UIDS if shard_of(u, 2) == 1)
    shard = ShardFilter(ordinal=1, total=2)
    head = (b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p",'
            b'"generateName":"p-","namespace":"ns","uid":"%s","resourceVersion":"41","labels":{"a":"b"}')
    assert _API_LAYOUT.match(head % theirs.encode()) is not None
    assert shard.skip_line(head % theirs.encode() + b',"unread": [}') == "41"
    assert shard.skip_line(head % mine.encode() + b"}}}") is None  # this shard's: decoded in full
    # Another layout (labels before the uid): the msgspec pass, which needs the whole line.
    other = (b'{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"p","labels":{"a":"b"},'
             b'"uid":"%s","resourceVersion":"42"}}}' % theirs.encode())
    assert _API_LAYOUT.match(other) is None
    assert shard.skip_line(other) == "42"
    assert shard.skip_line(other[:-1]) is None  # unreadable: the full decoder reports it
    assert shard.skipped == 2
