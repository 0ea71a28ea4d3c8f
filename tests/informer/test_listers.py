"""Lister: read-only queries over the cache by namespace/name, label selector and named index."""

from __future__ import annotations

import pytest

from bridge.contracts import KubeObject
from bridge.informer.listers import NAMESPACE_ALL, Lister
from bridge.informer.store import NAMESPACE_INDEX, IndexedCache
from bridge.kube.labels import SelectorError, parse_label_selector


def obj(name: str, ns: str = "", **labels: str) -> KubeObject:
    meta: dict[str, object] = {"name": name, "labels": labels}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta}


def by_node(o: KubeObject) -> list[str]:
    node = o.get("spec", {}).get("nodeName")
    return [node] if node else []


def names(objs: list[KubeObject]) -> list[str]:
    return sorted(f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in objs)


@pytest.fixture
def cache() -> IndexedCache:
    c = IndexedCache(indexers={NAMESPACE_INDEX: lambda o: [o["metadata"].get("namespace", "")],
                               "node": by_node})
    for o in (
        obj("web-1", "prod", app="web", tier="front"),
        obj("web-2", "prod", app="web"),
        obj("db-1", "prod", app="db"),
        obj("web-1", "dev", app="web"),
        obj("node-a", role="worker"),
        obj("node-b"),
    ):
        c.add(o)
    c.add({**obj("pinned", "prod"), "spec": {"nodeName": "node-a"}})
    return c


def test_get_namespaced_cluster_scoped_and_missing(cache: IndexedCache) -> None:
    lister = Lister(indexer=cache)
    got = lister.get("prod", "web-1")
    assert got is cache.get_by_key(cache.list_keys()[0])
    assert got is not None
    assert got["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert lister.get("dev", "web-1") == obj("web-1", "dev", app="web")
    assert lister.get("", "node-a") == obj("node-a", role="worker")
    assert lister.get("prod", "nope") is None
    assert lister.get("", "web-1") is None


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, ["/node-a", "/node-b", "dev/web-1", "prod/db-1", "prod/pinned", "prod/web-1",
                "prod/web-2"]),
        ("", ["/node-a", "/node-b", "dev/web-1", "prod/db-1", "prod/pinned", "prod/web-1",
              "prod/web-2"]),
        ("app=web", ["dev/web-1", "prod/web-1", "prod/web-2"]),
        ("app=web,tier=front", ["prod/web-1"]),
        ("app in (web,db),tier!=front", ["dev/web-1", "prod/db-1", "prod/web-2"]),
        ("!app", ["/node-a", "/node-b", "prod/pinned"]),
        ("role", ["/node-a"]),
        (parse_label_selector("app notin (web)"), ["/node-a", "/node-b", "prod/db-1", "prod/pinned"]),
    ],
)
def test_list_with_label_selector(cache: IndexedCache, selector: object, expected: list[str]) -> None:
    lister = Lister(indexer=cache)
    assert names(lister.list(selector)) == expected  # type: ignore[arg-type]


def test_list_rejects_a_malformed_selector(cache: IndexedCache) -> None:
    expected = r"^unable to parse requirement: found '', expected: ',' or '\)'$"
    with pytest.raises(SelectorError, match=expected):
        Lister(indexer=cache).list("app in (web")


@pytest.mark.parametrize(
    ("namespace", "selector", "expected"),
    [
        ("prod", None, ["prod/db-1", "prod/pinned", "prod/web-1", "prod/web-2"]),
        ("prod", "app=web", ["prod/web-1", "prod/web-2"]),
        ("dev", None, ["dev/web-1"]),
        ("dev", "app=db", []),
        ("missing", None, []),
        (NAMESPACE_ALL, "app=web", ["dev/web-1", "prod/web-1", "prod/web-2"]),
    ],
)
@pytest.mark.parametrize("with_namespace_index", [True, False], ids=["indexed", "scan"])
def test_list_namespace(
    cache: IndexedCache, with_namespace_index: bool, namespace: str, selector: str | None,
    expected: list[str],
) -> None:
    if not with_namespace_index:
        plain = IndexedCache(indexers={})
        plain.replace(cache.list(), "1")
        cache = plain
    lister = Lister(indexer=cache)
    assert names(lister.list_namespace(namespace, selector)) == expected


def test_list_namespace_uses_the_namespace_index(cache: IndexedCache) -> None:
    class CountingCache(IndexedCache):
        full_lists = 0

        def list(self) -> list[KubeObject]:
            CountingCache.full_lists += 1
            return super().list()

    counting = CountingCache()
    counting.replace(cache.list(), "1")
    result = Lister(indexer=counting).list_namespace("dev")
    assert names(result) == ["dev/web-1"]
    assert CountingCache.full_lists == 0


def test_by_index_and_index_keys(cache: IndexedCache) -> None:
    lister = Lister(indexer=cache)
    assert names(lister.by_index("node", "node-a")) == ["prod/pinned"]
    assert lister.by_index("node", "node-z") == []
    assert lister.index_keys(NAMESPACE_INDEX, "prod") == ["prod/db-1", "prod/pinned", "prod/web-1",
                                                          "prod/web-2"]
    with pytest.raises(KeyError, match="index 'nope' does not exist"):
        lister.by_index("nope", "x")


def test_lister_sees_later_cache_changes(cache: IndexedCache) -> None:
    lister = Lister(indexer=cache)
    cache.delete(obj("web-2", "prod"))
    cache.add(obj("web-3", "prod", app="web"))
    assert names(lister.list_namespace("prod", "app=web")) == ["prod/web-1", "prod/web-3"]
