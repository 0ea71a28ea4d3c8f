"""RawObject: decoding from wire bytes (managedFields cut out of the bytes, apiVersion/kind filled in)
against decoding into dicts, the read-only Mapping it promises, splicing its bytes into JSON, and the
compact cache that stores objects as RawObjects and hands out fresh ones."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.contracts import ObjectKey
from bridge.informer.store import NAMESPACE_INDEX, IndexedCache, meta_namespace_index_func
from bridge.informer.transform import drop_managed_fields
from bridge.rawobject import (
    RawObject,
    RawObjectError,
    decode_object,
    dumps,
    identity_metadata,
    object_identity,
    object_key,
    plain,
    to_json,
)

K = ObjectKey

# ---------------------------------------------------------------------------------- generators

# Text that looks like the JSON the byte-level cutting searches for, quotes and escapes, and
# non-ASCII (orjson writes it as raw UTF-8, never \u-escaped).
TRICKY = [
    '"managedFields":', '"metadata":', '{"metadata":{', ',"managedFields":[]', '"resourceVersion":"1"',
    '"', "\\", '\\"', "}", "]", ",", "é", "日本", "🙂", "\u2028", "\n", "\t", "",
]
_text = st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=6)), max_size=3).map("".join)
_keys = st.one_of(
    st.sampled_from(["metadata", "managedFields", "resourceVersion", "name", "apiVersion", "kind"]), _text
)
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False), _text,
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=12,
)
_managed_fields = st.lists(
    st.fixed_dictionaries({
        "manager": _text,
        "operation": st.sampled_from(["Update", "Apply"]),
        "fieldsV1": st.dictionaries(_keys, _json, max_size=2),
    }),
    max_size=2,
)


@st.composite
def metadata_st(draw: st.DrawFn, *, nested: bool = False) -> dict[str, Any]:
    """Object metadata with its members in any order; managedFields (maybe empty) or not."""
    entries: list[tuple[str, Any]] = []
    for key, value in (
        ("name", draw(st.sampled_from(["web-0", "a", "ü-ñ", ""]))),
        ("namespace", draw(st.sampled_from(["default", "kube-system", ""]))),
        ("uid", draw(st.sampled_from(["u-1", "8f0c-…"]))),
        ("resourceVersion", draw(st.sampled_from(["1", "42", "987654321"]))),
        ("labels", draw(st.dictionaries(_text, _text, max_size=3))),
        ("annotations", draw(st.dictionaries(_text, _text, max_size=3))),
        ("managedFields", draw(_managed_fields)),
    ):
        if draw(st.booleans()):
            entries.append((key, value))
    if nested:
        # A template's metadata: never byte-identical to the top-level one (the top level never has
        # generateName here); the identical case is a test of its own below.
        entries.append(("generateName", "nested-"))
    return dict(draw(st.permutations(entries)))


@st.composite
def object_st(draw: st.DrawFn) -> dict[str, Any]:
    """An object whose top-level members come in any order (metadata not necessarily first), whose
    spec may nest "metadata" and "managedFields" keys, and whose strings hold tricky text."""
    spec: dict[str, Any] = draw(st.dictionaries(_keys, _json, max_size=3))
    if draw(st.booleans()):
        spec["template"] = {"metadata": draw(metadata_st(nested=True)),
                            "managedFields": draw(_managed_fields)}
    entries: list[tuple[str, Any]] = [("metadata", draw(metadata_st()))]
    if draw(st.booleans()):
        entries.append(("apiVersion", draw(st.sampled_from(["v1", "apps/v1"]))))
    if draw(st.booleans()):
        entries.append(("kind", draw(st.sampled_from(["Pod", "Deployment"]))))
    empty_spec: bool = draw(st.booleans())
    if spec or empty_spec:
        entries.append(("spec", spec))
    if draw(st.booleans()):
        entries.append(("status", draw(_json)))
    return dict(draw(st.permutations(entries)))


def check_identity(got: RawObject, meta: dict[str, Any]) -> None:
    assert got.name == meta.get("name", "")
    assert got.namespace == meta.get("namespace", "")
    assert got.uid == meta.get("uid", "")
    assert got.resource_version == meta.get("resourceVersion", "")
    assert got.managed_fields == ("managedFields" in meta)
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    assert got.key == (f"{ns}/{name}" if ns else name)


# ---------------------------------------------------------------------------------- decode_object


@settings(max_examples=200, deadline=None)
@given(object_st())
def test_decode_object_equals_the_dict_decoder(obj: dict[str, Any]) -> None:
    wire = orjson.dumps(obj)
    expected = drop_managed_fields(obj)

    dropped = decode_object(wire, drop_managed_fields=True)
    assert orjson.loads(dropped.raw) == expected  # the bytes themselves, not only the mapping
    assert dropped.metadata == expected["metadata"]  # decoded from the bytes on its own
    assert dropped == expected
    assert dropped.to_dict() == expected
    check_identity(dropped, expected["metadata"])
    assert not dropped.managed_fields
    if "managedFields" not in obj["metadata"]:
        assert dropped.raw == wire  # nothing to cut: the wire bytes, verbatim

    kept = decode_object(wire)
    assert kept.raw == wire
    assert kept == obj
    check_identity(kept, obj["metadata"])

    filled = decode_object(wire, api_version="fill/v9", kind="Filled", drop_managed_fields=True)
    want = {"apiVersion": "fill/v9", "kind": "Filled", **expected}  # present members win
    assert orjson.loads(filled.raw) == want
    assert filled == want
    check_identity(filled, expected["metadata"])

    # Indented JSON takes the decode/re-encode path for the cut; the result is the same.
    indented = orjson.dumps(obj, option=orjson.OPT_INDENT_2)
    for got, target in (
        (decode_object(indented, drop_managed_fields=True), expected),
        (decode_object(indented, api_version="fill/v9", kind="Filled", drop_managed_fields=True), want),
        (decode_object(indented, api_version="fill/v9", kind="Filled"),
         {"apiVersion": "fill/v9", "kind": "Filled", **obj}),
    ):
        assert orjson.loads(got.raw) == target
        assert got == target
        check_identity(got, target["metadata"])


def test_decode_object_cuts_managed_fields_wherever_they_sit_in_metadata() -> None:
    mf = [{"manager": "kubectl", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
    for position in range(4):
        members: list[tuple[str, Any]] = [("name", "a"), ("namespace", "ns"), ("resourceVersion", "7")]
        members.insert(position, ("managedFields", mf))
        obj = {"metadata": dict(members), "spec": {"managedFields": mf, "metadata": {"managedFields": mf}}}
        got = decode_object(orjson.dumps(obj), drop_managed_fields=True)
        assert orjson.loads(got.raw) == {
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7"},
            "spec": {"managedFields": mf, "metadata": {"managedFields": mf}},  # not the object's
        }
        assert got.identity == ("a", "ns", "", "7", False)


def test_decode_object_fills_api_version_and_kind_only_when_missing() -> None:
    got = decode_object(b'{"metadata":{"name":"a"}}', api_version="v1", kind="Pod")
    assert got.raw == b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}'
    own = decode_object(b'{"kind":"Node","metadata":{"name":"a"}}', api_version="v1", kind="Pod")
    assert orjson.loads(own.raw) == {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}
    whole = b'{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a"}}'
    assert decode_object(whole, api_version="v1", kind="Pod").raw == whole


def test_decode_object_accepts_msgspec_raw() -> None:
    wire = msgspec.Raw(b'{"metadata":{"name":"a","managedFields":[]}}')
    got = decode_object(wire, drop_managed_fields=True)
    assert got.raw == b'{"metadata":{"name":"a"}}'
    assert type(got.raw) is bytes


_NOT_OBJECTS = [
    b"not json",
    b"[1, 2]",
    b'"a string"',
    b"{}",
    b'{"spec": {"metadata": {}}}',
    b'{"metadata": [1]}',
    b'{"metadata": "x"}',
    b'{"metadata": null}',
    b'{"metadata": {"name": "a"}',
]


@pytest.mark.parametrize(
    "bad",
    _NOT_OBJECTS
    + [orjson.dumps(orjson.loads(b), option=orjson.OPT_INDENT_2) for b in _NOT_OBJECTS[1:8]],
)
@pytest.mark.parametrize("drop", [False, True])
def test_decode_object_rejects_what_is_not_an_object_with_metadata(bad: bytes, drop: bool) -> None:
    with pytest.raises(RawObjectError) as info:
        decode_object(bad, drop_managed_fields=drop, api_version="v1", kind="Pod")
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match=r"not a Kubernetes object|needs a metadata mapping"):
        decode_object(bad, drop_managed_fields=drop)


def test_from_dict_rejects_objects_without_a_metadata_mapping() -> None:
    with pytest.raises(RawObjectError):
        RawObject.from_dict({"kind": "Pod"})
    with pytest.raises(RawObjectError):
        RawObject.from_dict({"metadata": "x"})
    raw = decode_object(b'{"metadata":{"name":"a"}}')
    assert RawObject.from_dict(raw) is raw


# ---------------------------------------------------------------------------------- Mapping


def pod_dict(name: str = "web-0", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "5",
                     "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx"}]},
        **extra,
    }


def test_mapping_reads() -> None:
    d = pod_dict()
    r = decode_object(orjson.dumps(d))
    assert r["spec"]["nodeName"] == "n1"
    assert r["metadata"]["labels"] == {"app": "web"}
    with pytest.raises(KeyError):
        r["status"]
    assert r.get("status") is None
    assert r.get("status", "none") == "none"
    assert r.get("kind") == "Pod"
    assert "spec" in r
    assert "metadata" in r
    assert "status" not in r
    assert list(r) == ["apiVersion", "kind", "metadata", "spec"]
    assert len(r) == 4
    assert dict(r.items()) == d
    assert list(r.keys()) == list(d)


def test_equality_against_dicts_and_raw_objects() -> None:
    d = pod_dict()
    r = decode_object(orjson.dumps(d))
    assert r == d
    assert d == r
    assert r == decode_object(orjson.dumps(d))
    # Same object, other layout: equal as mappings although the bytes differ.
    spaced = RawObject(orjson.dumps(d, option=orjson.OPT_INDENT_2))
    assert spaced.raw != r.raw
    assert spaced == r
    other = decode_object(orjson.dumps(pod_dict("web-1")))
    assert r != other
    assert r != pod_dict("web-1")
    assert r != {**d, "status": {}}
    assert (r == 5) is False
    assert r != [1]


def test_unhashable_immutable_copies_and_pickle() -> None:
    r = decode_object(orjson.dumps(pod_dict()))
    with pytest.raises(TypeError):
        hash(r)
    with pytest.raises(TypeError):
        {r}  # noqa: B018
    assert copy.copy(r) is r
    assert copy.deepcopy(r) is r
    assert copy.deepcopy({"x": [r]})["x"][0] is r
    with pytest.raises(TypeError):
        r["spec"] = {}  # type: ignore[index]
    with pytest.raises(AttributeError):
        r.foo = 1  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is RawObject
    assert back.raw == r.raw
    assert back == r
    assert back.identity == r.identity
    with_mf = decode_object(orjson.dumps(pod_dict() | {"metadata": {"name": "m", "managedFields": []}}))
    assert pickle.loads(pickle.dumps(with_mf)).managed_fields is True


def test_copy_dict_is_independent_and_to_dict_is_shared() -> None:
    r = decode_object(orjson.dumps(pod_dict()))
    mine = r.copy_dict()
    mine["spec"]["nodeName"] = "changed"
    mine["metadata"]["labels"]["app"] = "changed"
    assert r.to_dict()["spec"]["nodeName"] == "n1"
    assert r["metadata"]["labels"] == {"app": "web"}
    assert r.to_dict() is r.to_dict()
    assert r.copy_dict() is not r.copy_dict()
    assert orjson.loads(r.raw) == pod_dict()


def test_repr_names_the_object() -> None:
    r = decode_object(orjson.dumps(pod_dict()))
    text = repr(r)
    assert "ns/web-0" in text
    assert "rv='5'" in text
    assert f"{len(r.raw)} bytes" in text
    assert "'node" not in text  # the body is not dumped
    cluster = decode_object(b'{"metadata":{"name":"n1","resourceVersion":"3"}}')
    assert repr(cluster) == f"RawObject('n1', rv='3', {len(cluster.raw)} bytes)"


def test_metadata_is_decoded_without_the_body_and_identity_without_either() -> None:
    r = decode_object(orjson.dumps(pod_dict()))
    assert (r._meta, r._obj) == (None, None)
    assert r.identity == ("web-0", "ns", "uid-web-0", "5", False)
    assert (r._meta, r._obj) == (None, None)
    assert r["metadata"]["uid"] == "uid-web-0"
    assert r._obj is None
    assert r["kind"] == "Pod"
    assert r._obj is not None
    fresh = r.fresh()
    assert fresh.raw is r.raw
    assert (fresh._meta, fresh._obj) == (None, None)
    assert fresh.identity == r.identity


def test_without_managed_fields() -> None:
    obj = pod_dict()
    obj["metadata"]["managedFields"] = [{"manager": "m"}]
    kept = decode_object(orjson.dumps(obj))
    assert kept.managed_fields
    cut = kept.without_managed_fields()
    assert orjson.loads(cut.raw) == drop_managed_fields(obj)
    assert not cut.managed_fields
    assert cut.without_managed_fields() is cut
    assert drop_managed_fields(cut) is cut
    spaced = RawObject(orjson.dumps(obj, option=orjson.OPT_INDENT_2))  # falls back to re-encoding
    assert spaced.without_managed_fields() == drop_managed_fields(obj)


# ---------------------------------------------------------------------------------- JSON output


def test_dumps_splices_the_bytes_verbatim() -> None:
    spaced = RawObject(b'{"metadata": {"name": "a"}}')
    out = dumps({"data": spaced, "more": [spaced, {"x": 1}]})
    assert out == b'{"data":{"metadata": {"name": "a"}},"more":[{"metadata": {"name": "a"}},{"x":1}]}'
    assert spaced._obj is None  # written without decoding the body
    assert to_json(spaced) is spaced.raw
    assert dumps(spaced) == spaced.raw


def test_dumps_equals_orjson_of_the_decoded_equivalent() -> None:
    d = pod_dict(status={"phase": "Running", "note": '"metadata": "managedFields": \\ é'})
    r = decode_object(orjson.dumps(d))
    envelope = {"id": "1", "data": r, "both": {"object": r, "oldObject": None}}
    plain_envelope = {"id": "1", "data": d, "both": {"object": d, "oldObject": None}}
    assert dumps(envelope) == orjson.dumps(plain_envelope)
    assert dumps(envelope, orjson.OPT_APPEND_NEWLINE) == orjson.dumps(plain_envelope) + b"\n"
    assert to_json(d) == orjson.dumps(d)
    assert orjson.loads(dumps({"nested": {"deeper": [r]}})) == {"nested": {"deeper": [d]}}
    with pytest.raises(TypeError):
        dumps({"x": object()})


def test_plain_key_and_identity_helpers() -> None:
    d = pod_dict()
    r = decode_object(orjson.dumps(d))
    assert plain(r) == d
    assert type(plain(r)) is dict
    assert plain(d) is d
    assert object_key(r) == object_key(d) == "ns/web-0"
    assert object_identity(r) == object_identity(d) == ("uid-web-0", "5")
    node = {"metadata": {"name": "n1"}}
    assert object_key(decode_object(orjson.dumps(node))) == object_key(node) == "n1"
    assert object_identity(node) == ("", "")
    assert object_key({"kind": "X"}) == ""
    assert identity_metadata(r) == {"name": "web-0", "namespace": "ns", "uid": "uid-web-0",
                                    "resourceVersion": "5"}
    assert identity_metadata(decode_object(orjson.dumps(node))) == {
        "name": "n1", "uid": "", "resourceVersion": ""
    }


# ---------------------------------------------------------------------------------- compact cache


def by_app(obj: Any) -> list[str]:
    app = (obj["metadata"].get("labels") or {}).get("app")
    return [app] if app else []


def cached_pod(name: str, ns: str = "ns", app: str = "web", rv: str = "1",
               mf: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": rv, "labels": {"app": app}}
    if mf:
        meta["managedFields"] = [{"manager": "kubelet"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": f"node-{name}"}}


def raw_read(obj: Any) -> RawObject:
    """What a compact cache hands out: always a RawObject."""
    assert type(obj) is RawObject
    return obj


def test_compact_cache_stores_slim_raw_objects_and_hands_out_fresh_ones() -> None:
    cache = IndexedCache(compact=True, indexers={NAMESPACE_INDEX: meta_namespace_index_func, "app": by_app})
    as_dict = cached_pod("a", mf=True)
    as_raw = decode_object(orjson.dumps(cached_pod("b", ns="other", app="db", mf=True)))
    as_raw.to_dict()  # a decoded RawObject: the cache must not keep its decoded parts
    cache.add(as_dict)
    cache.add(as_raw)

    got = raw_read(cache.get_by_key(K("ns/a")))
    assert got == as_dict  # managedFields as given: the cache does not drop them
    assert got.managed_fields
    assert got.identity == ("a", "ns", "", "1", True)
    again = raw_read(cache.get_by_key(K("ns/a")))
    assert again is not got
    assert again == got
    assert got.to_dict()["spec"]["nodeName"] == "node-a"
    stored = cache._items[K("ns/a")]
    assert (stored._obj, stored._meta) == (None, None)  # a reader's decoding stays with the reader
    assert again._obj is None

    # An object added undecoded and decoded afterwards by whoever holds it (a handler, a sink):
    # the cache's copy stays undecoded.
    as_raw_later = decode_object(orjson.dumps(cached_pod("c", mf=True)))
    cache.add(as_raw_later)
    as_raw_later.to_dict()
    assert as_raw_later.metadata["name"] == "c"
    stored_c = cache._items[K("ns/c")]
    assert stored_c is not as_raw_later
    assert (stored_c._obj, stored_c._meta) == (None, None)
    cache.delete_key(K("ns/c"))

    b = cache.get_by_key(K("other/b"))
    assert b == as_raw
    assert b is not as_raw
    assert cache._items[K("other/b")].raw is as_raw.raw  # stored as it came, not re-encoded
    assert (cache._items[K("other/b")]._obj, cache._items[K("other/b")]._meta) == (None, None)
    assert cache.get(as_dict) == as_dict
    assert cache.get_by_key(K("ns/missing")) is None

    listed = cache.list()
    assert all(type(o) is RawObject for o in listed)
    assert sorted(listed, key=object_key) == [as_dict, as_raw]
    assert listed[0] is not cache.list()[0]
    snap = cache.snapshot()
    assert len(snap) == 2
    assert [object_key(o) for o in snap] == ["ns/a", "other/b"]
    assert snap[0] is not snap[0]  # a fresh instance per read
    assert list(snap[1:]) == [as_raw]

    assert cache.by_index(NAMESPACE_INDEX, "other") == [as_raw]
    assert cache.by_index("app", "web") == [as_dict]
    assert cache.index("app", cached_pod("x", app="db")) == [as_raw]
    assert cache.list_index_func_values(NAMESPACE_INDEX) == ["ns", "other"]
    for o in cache.by_index("app", "web"):
        raw_read(o).to_dict()
    assert cache._items[K("ns/a")]._obj is None

    # An update moves the object between index values; a delete removes it.
    cache.add(decode_object(orjson.dumps(cached_pod("a", app="db", rv="2"))))
    assert cache.by_index("app", "web") == []
    assert [object_identity(o)[1] for o in cache.by_index("app", "db")] == ["2", "1"]
    cache.delete(as_raw)
    assert cache.list_keys() == [K("ns/a")]
    assert snap[1] == as_raw  # a snapshot taken before keeps its content


def test_compact_cache_replace_takes_dicts_and_raw_objects() -> None:
    cache = IndexedCache(compact=True, indexers={NAMESPACE_INDEX: meta_namespace_index_func, "app": by_app})
    cache.add(cached_pod("old"))
    items: list[Any] = [
        cached_pod("a", app="web"),
        decode_object(orjson.dumps(cached_pod("b", ns="x", app="db", mf=True)), drop_managed_fields=True),
        decode_object(orjson.dumps(cached_pod("a", app="db", rv="9"))),  # a later duplicate wins
    ]
    cache.replace(items, "10")
    assert sorted(cache.list_keys()) == [K("ns/a"), K("x/b")]
    a = cache.get_by_key(K("ns/a"))
    assert a == cached_pod("a", app="db", rv="9")
    b = raw_read(cache.get_by_key(K("x/b")))
    assert b == drop_managed_fields(cached_pod("b", ns="x", app="db", mf=True))
    assert not b.managed_fields
    assert cache.index_keys("app", "db") == [K("ns/a"), K("x/b")]
    assert cache.index_keys("app", "web") == []
    assert cache.by_index(NAMESPACE_INDEX, "x") == [b]
    assert all(type(v) is RawObject and v._obj is None and v._meta is None for v in cache._items.values())


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("tail", [
    b',"object":{"metadata":{"name":"b","resourceVersion":"8"}}',
    b',"type":"ADDED","object":{"metadata":{"name":"b","resourceVersion":"8"}}',
])
def test_a_member_repeated_after_a_watch_lines_object_is_not_kept_in_its_bytes(one_pass: bool,
                                                                               tail: bytes) -> None:
    """A line whose ``object`` member comes twice is JSON, read as its last ``object`` (as every JSON
    decoder here reads duplicates). The watch line's framing took what lies between its prefix and
    its last brace for the object: bytes that are not JSON (``{…},"object":{…}``) under the second
    object's identity."""
    from bridge.kube.listwatch import raw_object_decoder

    line = b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"7"}}' + tail + b"}"
    for drop in (False, True):
        obj = raw_object_decoder(drop_managed_fields=drop, one_pass=one_pass)(line).object
        assert type(obj) is RawObject
        assert msgspec.json.decode(obj.raw) == msgspec.json.decode(line)["object"]
        assert (obj.name, obj.resource_version) == ("b", "8")


# ---------------------------------------------------------------------------------- known failures
# These fail against bridge/rawobject.py as committed (reported; not committed with the tests above).

_MF = [{"manager": "m"}]


def test_cut_does_not_touch_a_nested_metadata_identical_to_the_objects() -> None:
    # _metadata_span finds the first '"metadata":' followed by the same bytes: here the spec's.
    meta = {"name": "a", "managedFields": _MF}
    obj = {"spec": {"metadata": meta}, "metadata": meta}
    got = decode_object(orjson.dumps(obj), drop_managed_fields=True)
    assert orjson.loads(got.raw) == {"spec": {"metadata": meta}, "metadata": {"name": "a"}}
    assert got.managed_fields == ("managedFields" in got["metadata"])


def test_cut_takes_metadatas_own_managed_fields_not_a_nested_member() -> None:
    # _cut_member cuts the first '"managedFields":' + value after '{' or ',', at any depth.
    obj = {"metadata": {"x": {"managedFields": _MF}, "managedFields": _MF, "name": "a"}}
    got = decode_object(orjson.dumps(obj), drop_managed_fields=True)
    assert orjson.loads(got.raw) == {"metadata": {"x": {"managedFields": _MF}, "name": "a"}}


def test_duplicate_managed_fields_members_are_all_cut() -> None:
    dup = b'{"metadata":{"managedFields":[1],"name":"a","managedFields":[2]}}'
    got = decode_object(dup, drop_managed_fields=True)
    assert "managedFields" not in orjson.loads(got.raw)["metadata"]
    assert not got.managed_fields


def test_filling_kind_into_bytes_with_leading_whitespace_keeps_them_json() -> None:
    got = decode_object(b' {"metadata":{"name":"a"}}', api_version="v1", kind="Pod")
    assert orjson.loads(got.raw) == {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}
    assert orjson.loads(dumps({"data": got})) == {"data": orjson.loads(got.raw)}


def test_null_identity_members_decode_like_the_dict_decoder() -> None:
    # Raises msgspec.ValidationError (not RawObjectError) from _build's _ident_decoder; the dict
    # decoder accepts the object, so decode_list(raw_objects=True) rejects a whole List the dict
    # path lists.
    wire = b'{"metadata":{"name":"a","namespace":null}}'
    got = decode_object(wire)
    assert got == orjson.loads(wire)
    assert got.namespace == ""


def test_the_writer_of_one_second_is_one_change_shared_by_its_objects() -> None:
    """The newest managedFields entry is read once per (writer, second) and shared: equal for each
    object, and a plain mapping's entries (values of any type) are never mixed up through it."""
    from bridge.rawobject import Change, decode_object, last_change

    def line(name: str, when: str, manager: str) -> bytes:
        mf = [{"manager": "old", "operation": "Update", "time": "2024-01-01T00:00:00Z"},
              {"manager": manager, "operation": "Apply", "time": when}]
        return orjson.dumps({"metadata": {"name": name, "managedFields": mf}})

    a = decode_object(line("a", "2024-05-01T12:00:00Z", "kubelet"), drop_managed_fields=True)
    b = decode_object(line("b", "2024-05-01T12:00:00Z", "kubelet"), drop_managed_fields=True)
    c = decode_object(line("c", "2024-05-01T12:00:01Z", "kubelet"), drop_managed_fields=True)
    assert a.change == Change("kubelet", "Apply", "", "2024-05-01T12:00:00Z")
    assert b.change is a.change
    assert c.change == Change("kubelet", "Apply", "", "2024-05-01T12:00:01Z")
    t = "2024-05-01T12:00:00Z"
    one = {"metadata": {"managedFields": [{"manager": 1, "operation": "Update", "time": t}]}}
    true = {"metadata": {"managedFields": [{"manager": True, "operation": "Update", "time": t}]}}
    assert last_change(one) == Change("1", "Update", "", "2024-05-01T12:00:00Z")
    assert last_change(true) == Change("True", "Update", "", "2024-05-01T12:00:00Z")
