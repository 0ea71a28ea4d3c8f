"""IndexedCache and the key functions: keys, index maintenance, replace, add_indexers, errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.contracts import DeletedFinalStateUnknown, KubeObject, ObjectKey
from bridge.informer.store import (
    NAMESPACE_INDEX,
    IndexConflictError,
    IndexedCache,
    ObjectKeyError,
    UnknownIndexError,
    meta_namespace_index_func,
    meta_namespace_key_func,
    split_meta_namespace_key,
)


def pod(name: str, ns: str = "default", rv: str = "1", **labels: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels},
    }


def node(name: str) -> KubeObject:
    return {"kind": "Node", "metadata": {"name": name}}


def by_label_values(obj: KubeObject) -> list[str]:
    """A multi-valued index: every ``key=value`` label of the object."""
    labels = obj["metadata"].get("labels") or {}
    return [f"{k}={v}" for k, v in labels.items()]


def by_app(obj: KubeObject) -> list[str]:
    app = (obj["metadata"].get("labels") or {}).get("app")
    return [app] if app else []


K = ObjectKey

# -------------------------------------------------------------------------- key functions


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        (pod("web"), "default/web"),
        (pod("web", ns="kube-system"), "kube-system/web"),
        (node("n1"), "n1"),
        ({"metadata": {"name": "n1", "namespace": ""}}, "n1"),
        ({"metadata": {"name": "n1", "namespace": None}}, "n1"),
        (DeletedFinalStateUnknown(K("ns/gone"), pod("gone", ns="ns")), "ns/gone"),
        (DeletedFinalStateUnknown(K("whatever"), {}), "whatever"),
    ],
)
def test_meta_namespace_key_func(obj: Any, key: str) -> None:
    assert meta_namespace_key_func(obj) == key


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "Pod"}, "has no metadata"),
        ({"kind": "Pod", "metadata": {"namespace": "x"}}, r"'Pod' has no metadata\.name"),
        ({"kind": "Pod", "metadata": {"name": ""}}, r"has no metadata\.name"),
        ({"metadata": {"name": 7}}, r"has no metadata\.name"),
        ("default/web", "cannot compute a key for a str"),
        (None, "cannot compute a key for a NoneType"),
    ],
)
def test_meta_namespace_key_func_rejects_objects_without_a_name(obj: Any, message: str) -> None:
    with pytest.raises(ObjectKeyError, match=message) as info:
        meta_namespace_key_func(obj)
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ValueError)
    assert not str(info.value).startswith("'")  # a readable message, not KeyError's repr


@pytest.mark.parametrize(
    ("key", "parts"),
    [("ns/name", ("ns", "name")), ("name", ("", "name")), ("", ("", "")), ("/name", ("", "name"))],
)
def test_split_meta_namespace_key(key: str, parts: tuple[str, str]) -> None:
    assert split_meta_namespace_key(key) == parts


def test_split_meta_namespace_key_rejects_extra_slashes() -> None:
    with pytest.raises(ValueError, match="unexpected object key format 'a/b/c'"):
        split_meta_namespace_key("a/b/c")


@pytest.mark.parametrize(("obj", "values"), [(pod("a", ns="x"), ["x"]), (node("n"), [""])])
def test_meta_namespace_index_func(obj: KubeObject, values: list[str]) -> None:
    assert meta_namespace_index_func(obj) == values


# -------------------------------------------------------------------------- Store behaviour


def test_add_get_list_and_len() -> None:
    cache = IndexedCache()
    a, b, n = pod("a"), pod("b", ns="other"), node("n1")
    for obj in (a, b, n):
        cache.add(obj)
    assert len(cache) == 3
    assert cache.get_by_key(K("default/a")) is a
    assert cache.get_by_key(K("n1")) is n
    assert cache.get_by_key(K("default/zzz")) is None
    assert cache.get(pod("b", ns="other", rv="99")) is b
    assert cache.list() == [a, b, n]
    assert cache.list_keys() == ["default/a", "other/b", "n1"]
    assert "default/a" in cache
    assert "default/zzz" not in cache


def test_update_replaces_the_stored_object() -> None:
    cache = IndexedCache()
    cache.add(pod("a", rv="1"))
    newer = pod("a", rv="2")
    cache.update(newer)
    assert len(cache) == 1
    assert cache.get_by_key(K("default/a")) is newer


def test_delete_removes_by_object_or_tombstone_and_ignores_missing_keys() -> None:
    cache = IndexedCache()
    cache.add(pod("a"))
    cache.add(pod("b"))
    cache.delete(pod("a", rv="2"))
    cache.delete(DeletedFinalStateUnknown(K("default/b"), pod("b")))
    cache.delete(pod("never"))
    cache.delete_key(K("default/never"))
    assert len(cache) == 0
    assert cache.list_index_func_values(NAMESPACE_INDEX) == []


def test_resync_is_a_no_op() -> None:
    cache = IndexedCache()
    cache.add(pod("a"))
    cache.resync()
    assert cache.list_keys() == ["default/a"]


# -------------------------------------------------------------------------- indices


def test_default_namespace_index() -> None:
    cache = IndexedCache()
    for obj in (pod("b"), pod("a"), pod("c", ns="other"), node("n1")):
        cache.add(obj)
    assert cache.index_keys(NAMESPACE_INDEX, "default") == ["default/a", "default/b"]
    assert cache.index_keys(NAMESPACE_INDEX, "other") == ["other/c"]
    assert cache.index_keys(NAMESPACE_INDEX, "") == ["n1"]
    assert cache.index_keys(NAMESPACE_INDEX, "nowhere") == []
    assert [o["metadata"]["name"] for o in cache.by_index(NAMESPACE_INDEX, "default")] == ["a", "b"]
    assert cache.list_index_func_values(NAMESPACE_INDEX) == ["", "default", "other"]
    assert cache.get_indexers().keys() == {NAMESPACE_INDEX}


def test_explicit_empty_indexers_means_no_index() -> None:
    cache = IndexedCache(indexers={})
    cache.add(pod("a"))
    assert not cache.has_index(NAMESPACE_INDEX)
    with pytest.raises(UnknownIndexError, match="known indices: none"):
        cache.by_index(NAMESPACE_INDEX, "default")


def test_update_removes_old_index_values_and_drops_empty_sets() -> None:
    cache = IndexedCache(indexers={"labels": by_label_values})
    cache.add(pod("a", app="web", tier="front"))
    cache.add(pod("b", app="web"))
    assert cache.list_index_func_values("labels") == ["app=web", "tier=front"]

    cache.update(pod("a", app="api", tier="front"))
    assert cache.index_keys("labels", "app=web") == ["default/b"]
    assert cache.index_keys("labels", "app=api") == ["default/a"]
    assert cache.index_keys("labels", "tier=front") == ["default/a"]

    cache.update(pod("a", app="api"))
    assert cache.list_index_func_values("labels") == ["app=api", "app=web"]  # tier=front dropped

    cache.update(pod("b", app="api"))
    assert cache.list_index_func_values("labels") == ["app=api"]  # app=web dropped
    assert cache.index_keys("labels", "app=api") == ["default/a", "default/b"]
    assert cache.by_index("labels", "app=api") == [pod("a", app="api"), pod("b", app="api")]

    cache.delete(pod("a"))
    cache.delete(pod("b"))
    assert cache.list_index_func_values("labels") == []


def test_update_with_unchanged_index_values_keeps_the_index() -> None:
    cache = IndexedCache(indexers={"app": by_app})
    cache.add(pod("a", rv="1", app="web"))
    second = pod("a", rv="2", app="web")
    cache.update(second)
    assert cache.index_keys("app", "web") == ["default/a"]
    assert cache.by_index("app", "web")[0] is second


def test_index_returns_objects_sharing_any_value_in_key_order() -> None:
    cache = IndexedCache(indexers={"labels": by_label_values})
    cache.add(pod("c", tier="front"))
    cache.add(pod("b", app="web"))
    cache.add(pod("a", app="db"))
    probe = pod("probe", app="web", tier="front")
    assert [o["metadata"]["name"] for o in cache.index("labels", probe)] == ["b", "c"]
    assert cache.index("labels", pod("probe")) == []


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(lambda c: c.index("nope", pod("a")), id="index"),
        pytest.param(lambda c: c.index_keys("nope", "x"), id="index_keys"),
        pytest.param(lambda c: c.by_index("nope", "x"), id="by_index"),
        pytest.param(lambda c: c.list_index_func_values("nope"), id="list_index_func_values"),
    ],
)
def test_unknown_index_is_a_key_error_with_a_clear_message(query: Any) -> None:
    cache = IndexedCache()
    cache.add(pod("a"))
    with pytest.raises(KeyError) as info:
        query(cache)
    assert isinstance(info.value, UnknownIndexError)
    assert str(info.value) == (
        "index 'nope' does not exist (known indices: namespace); add it with add_indexers"
    )


def test_replace_swaps_content_and_rebuilds_indices() -> None:
    cache = IndexedCache(indexers={NAMESPACE_INDEX: meta_namespace_index_func, "app": by_app})
    cache.add(pod("old", app="web"))
    cache.add(pod("keep", rv="1", app="web"))
    cache.replace([pod("keep", rv="2", app="db"), pod("new", ns="x", app="db"),
                   pod("new", ns="x", rv="9", app="db")], "100")
    assert cache.list_keys() == ["default/keep", "x/new"]
    assert cache.get_by_key(K("x/new")) == pod("new", ns="x", rv="9", app="db")  # later duplicate wins
    assert cache.list_index_func_values("app") == ["db"]
    assert cache.index_keys("app", "db") == ["default/keep", "x/new"]
    assert cache.list_index_func_values(NAMESPACE_INDEX) == ["default", "x"]
    assert cache.index_keys(NAMESPACE_INDEX, "default") == ["default/keep"]

    cache.replace([], "101")
    assert len(cache) == 0
    assert cache.list_index_func_values("app") == []


def test_add_indexers_backfills_and_maintains_the_new_index() -> None:
    cache = IndexedCache()
    cache.add(pod("a", app="web"))
    cache.add(pod("b", app="db"))
    cache.add(pod("c"))
    cache.add_indexers({"app": by_app})
    assert cache.list_index_func_values("app") == ["db", "web"]
    assert cache.index_keys("app", "web") == ["default/a"]
    cache.update(pod("b", app="web"))
    cache.add(pod("d", app="web"))
    assert cache.index_keys("app", "web") == ["default/a", "default/b", "default/d"]
    assert cache.list_index_func_values("app") == ["web"]
    assert cache.get_indexers().keys() == {NAMESPACE_INDEX, "app"}


def test_add_indexers_with_a_name_in_use_is_a_value_error_and_changes_nothing() -> None:
    cache = IndexedCache()
    cache.add(pod("a", app="web"))
    with pytest.raises(ValueError, match="indexer name\\(s\\) already in use: namespace") as info:
        cache.add_indexers({"app": by_app, NAMESPACE_INDEX: by_app})
    assert isinstance(info.value, IndexConflictError)
    assert not cache.has_index("app")
    assert cache.index_keys(NAMESPACE_INDEX, "default") == ["default/a"]


def test_add_indexers_whose_function_raises_changes_nothing() -> None:
    def broken(obj: KubeObject) -> list[str]:
        raise RuntimeError("index function failed")

    cache = IndexedCache()
    cache.add(pod("a"))
    with pytest.raises(RuntimeError, match="index function failed"):
        cache.add_indexers({"broken": broken})
    assert not cache.has_index("broken")


def test_an_index_function_that_raises_leaves_the_cache_unchanged() -> None:
    def strict_app(obj: KubeObject) -> list[str]:
        app = obj["metadata"]["labels"].get("app")
        if app == "bad":
            raise RuntimeError("cannot index app=bad")
        return [app] if app else []

    cache = IndexedCache(indexers={NAMESPACE_INDEX: meta_namespace_index_func, "app": strict_app})
    good = pod("a", app="web")
    cache.add(good)
    for action in (cache.add, cache.update):
        with pytest.raises(RuntimeError, match="cannot index"):
            action(pod("a", ns="default", app="bad"))
        with pytest.raises(RuntimeError, match="cannot index"):
            action(pod("b", ns="other", app="bad"))
    with pytest.raises(RuntimeError, match="cannot index"):
        cache.replace([pod("c", app="db"), pod("d", app="bad")], "2")
    assert cache.list() == [good]
    assert cache.list_index_func_values(NAMESPACE_INDEX) == ["default"]
    assert cache.list_index_func_values("app") == ["web"]
    assert cache.index_keys("app", "web") == ["default/a"]


def test_custom_key_func() -> None:
    def by_uid(obj: Any) -> ObjectKey:
        if isinstance(obj, DeletedFinalStateUnknown):
            return obj.key
        return ObjectKey(obj["metadata"]["uid"])

    cache = IndexedCache(key_func=by_uid)
    cache.add({"metadata": {"name": "a", "namespace": "x", "uid": "u1"}})
    assert cache.list_keys() == ["u1"]
    assert cache.index_keys(NAMESPACE_INDEX, "x") == ["u1"]


# -------------------------------------------------------------------------- property: indices stay exact

_names = st.sampled_from(["a", "b", "c", "d"])
_namespaces = st.sampled_from(["n1", "n2", ""])
_apps = st.sampled_from(["web", "db", None])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _names, _namespaces, _apps),
        st.tuples(st.just("delete"), _names, _namespaces, _apps),
        st.tuples(st.just("replace"), st.lists(st.tuples(_names, _namespaces, _apps), max_size=4)),
    ),
    max_size=25,
)


def _obj(name: str, ns: str, app: str | None) -> KubeObject:
    return {"metadata": {"name": name, "namespace": ns, "labels": {"app": app} if app else {}}}


@settings(max_examples=200, deadline=None)
@given(_ops, st.booleans())
def test_indices_always_equal_a_rebuild_from_scratch(ops: list[tuple[Any, ...]], compact: bool) -> None:
    cache = IndexedCache(indexers={NAMESPACE_INDEX: meta_namespace_index_func, "app": by_app},
                         compact=compact)
    model: dict[str, KubeObject] = {}
    for op in ops:
        if op[0] == "add":
            obj = _obj(*op[1:])
            cache.add(obj)
            model[meta_namespace_key_func(obj)] = obj
        elif op[0] == "delete":
            obj = _obj(*op[1:])
            cache.delete(obj)
            model.pop(meta_namespace_key_func(obj), None)
        else:
            objs = [_obj(*spec) for spec in op[1]]
            cache.replace(objs, "1")
            model = {meta_namespace_key_func(o): o for o in objs}
    assert dict(zip(cache.list_keys(), cache.list(), strict=True)) == model
    for name, func in ((NAMESPACE_INDEX, meta_namespace_index_func), ("app", by_app)):
        expected: dict[str, list[str]] = {}
        for key, obj in model.items():
            for value in func(obj):
                expected.setdefault(value, []).append(key)
        assert cache.list_index_func_values(name) == sorted(expected)
        for value, keys in expected.items():
            assert cache.index_keys(name, value) == sorted(keys)


def test_compact_cache_stores_bytes_and_reads_fresh_copies() -> None:
    cache = IndexedCache(compact=True, indexers={NAMESPACE_INDEX: meta_namespace_index_func, "app": by_app})
    a = pod("a", app="web")
    cache.add(a)
    got = cache.get_by_key(K("default/a"))
    assert got == a
    assert got is not a
    got["metadata"]["name"] = "changed"  # a reader's copy: the cache is unaffected
    assert cache.get_by_key(K("default/a")) == a
    assert cache.by_index("app", "web") == [a]
    assert cache.index("app", pod("x", app="web")) == [a]
    cache.add(pod("a", app="db"))
    assert cache.by_index("app", "web") == []
    assert cache.list_index_func_values("app") == ["db"]
    snap = cache.snapshot()
    cache.delete(a)
    assert len(cache) == 0
    assert [o["metadata"]["labels"]["app"] for o in snap] == ["db"]  # taken before the delete
    assert snap[0] == pod("a", app="db")


def test_compact_cache_takes_less_memory_than_dicts() -> None:
    import tracemalloc

    def footprint(compact: bool) -> int:
        cache = IndexedCache(compact=compact)
        cache.add(pod("warm-up"))  # first-use allocations of the encoder stay out of the figure
        tracemalloc.start()
        for i in range(300):
            obj = pod(f"p{i}", ns=f"n{i % 5}", app="web")
            obj["spec"] = {"containers": [{"name": "c", "image": "registry/app:1.0",
                                           "args": ["--flag", str(i)], "env": [{"name": "A", "value": "b"}]}]}
            cache.add(obj)
        size, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(cache) == 301
        return size

    assert footprint(True) < footprint(False) / 2


@pytest.mark.parametrize("compact", [False, True])
def test_raw_objects_with_the_default_index_keep_the_index_exact(compact: bool) -> None:
    """RawObjects under the default namespace index alone take their index values from their
    namespace (no index function call): the index must stay what the function would give, also for
    an object moving namespace under a custom key, and once another index is added."""
    from bridge.rawobject import RawObject

    cache = IndexedCache(compact=compact, key_func=lambda o: ObjectKey(o["metadata"]["name"]))
    cache.add(RawObject.from_dict(pod("a", ns="n1", app="web")))
    cache.add(RawObject.from_dict(pod("b", ns="n1")))
    cache.store(ObjectKey("a"), RawObject.from_dict(pod("a", ns="n2", app="web")))
    assert cache.index_keys(NAMESPACE_INDEX, "n1") == ["b"]
    assert cache.index_keys(NAMESPACE_INDEX, "n2") == ["a"]
    cache.add_indexers({"app": by_app})
    cache.add(RawObject.from_dict(pod("b", ns="n2", app="db")))
    assert cache.list_index_func_values(NAMESPACE_INDEX) == ["n2"]
    assert cache.index_keys("app", "db") == ["b"]
    assert cache.index_keys("app", "web") == ["a"]
    got = cache.get_by_key(ObjectKey("b"))
    assert got is not None
    assert got["metadata"]["namespace"] == "n2"


def test_a_raw_object_key_is_derived_once_and_kept_by_fresh_copies() -> None:
    from bridge.rawobject import RawObject, decode_object

    obj = decode_object(b'{"metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"7"}}')
    assert obj.key == meta_namespace_key_func(obj) == "ns/a"
    copy = obj.fresh()
    assert (copy.key, copy.uid, copy.resource_version, copy.raw) == ("ns/a", "u", "7", obj.raw)
    cluster = RawObject.from_dict({"metadata": {"name": "n"}})
    assert cluster.key == meta_namespace_key_func(cluster) == "n"
