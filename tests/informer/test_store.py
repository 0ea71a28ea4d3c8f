"""IndexedCache: keys, index maintenance, replace, add_indexers, unknown-index errors."""

from __future__ import annotations

from bridge.store import IndexedCache


def pod(name: str, ns: str = "default", rv: str = "1") -> dict[str, object]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


def test_add_then_get() -> None:
    cache = IndexedCache()
    cache.add(pod("a"))
    assert cache.get_by_key("default/a") == pod("a")  # type: ignore[arg-type]
    assert cache.index_keys("namespace", "default") == ["default/a"]
