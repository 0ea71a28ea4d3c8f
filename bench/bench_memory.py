"""Memory per cached object: the informer cache against the raw JSON and the naive caches.

Each variant runs in a fresh Python process (``python -m bench.bench_memory child VARIANT COUNT``) so
that one variant's freed memory cannot hide another's growth. The child first builds the API's JSON
for COUNT realistic Pods (``bridge.sim.objects.make_pod`` templates, each with its own name, uid and
resourceVersion, managedFields included as the API server sends them), then measures:

* **RSS delta**: ``VmRSS`` after filling the cache minus before (both after ``gc.collect()``), divided
  by COUNT; sampled at ten points while filling, for the memory-vs-objects plot;
* **tracemalloc**: the bytes Python allocated for 1,000 more objects cached the same way, divided by
  1,000 (a cross-check that ignores allocator slack).

Variants:

* ``bridge`` - what the service ships: the watch line decoded by the bridge's decoder
  (``decode_watch_event``), the default transform (managedFields dropped), stored in the informer's
  compact ``IndexedCache`` (objects kept as their JSON bytes; namespace index);
* ``bridge_dicts`` - the same with ``cache.compact: false`` (objects kept as dict trees);
* ``bridge_keep_managed`` - dict trees without the transform;
* ``naive_dict`` - ``json.loads`` into a plain ``{key: dict}``: what a hand-written watcher keeps;
* ``naive_typed`` - the official client's typed ``V1Pod`` models (``ApiClient.deserialize``), as
  ``watch.Watch().stream()`` yields them; slow to build, so measured on fewer objects;
* ``raw_bytes`` - the JSON bytes themselves (managedFields dropped, copied to their exact size since
  ``orjson.dumps`` returns a buffer about twice the length): the floor a bytes-based cache could
  approach.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.common import pod_templates, rss_bytes, vary_pod, write_result

__all__ = ["VARIANTS", "run"]

VARIANTS = ("bridge", "bridge_dicts", "bridge_keep_managed", "naive_dict", "naive_typed", "raw_bytes")
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
_FULL_COUNTS = {"bridge": 100_000, "bridge_dicts": 100_000, "bridge_keep_managed": 25_000,
                "naive_dict": 25_000, "naive_typed": 5_000, "raw_bytes": 25_000}
"""Objects per variant on a full run: the baselines' bytes per object do not depend on the count
(see the curves), so they are measured on fewer objects to keep the run short."""
_QUICK_COUNTS = {"bridge": 2000, "bridge_dicts": 2000, "bridge_keep_managed": 2000, "naive_dict": 2000,
                 "naive_typed": 300, "raw_bytes": 2000}


def _api_json(count: int, offset: int = 0) -> list[bytes]:
    """``count`` Pods as the API server encodes them (watch lines ``{"type":"ADDED","object":…}``)."""
    templates = pod_templates()
    lines: list[bytes] = []
    for i in range(offset, offset + count):
        pod = vary_pod(templates[i % len(templates)], f"pod-{i}", f"ns-{i % 50}")
        pod["metadata"]["uid"] = str(uuid.UUID(int=i + 1))
        pod["metadata"]["resourceVersion"] = str(1000 + i)
        pod["metadata"]["creationTimestamp"] = "2026-11-21T10:00:00Z"
        lines.append(orjson.dumps({"type": "ADDED", "object": pod}))
    return lines


def _filler(variant: str) -> tuple[Callable[[bytes], None], Callable[[], int]]:
    """(add one watch line to a new cache, how many objects it holds)."""
    if variant in ("bridge", "bridge_dicts", "bridge_keep_managed"):
        from bridge.informer.store import IndexedCache, meta_namespace_index_func, meta_namespace_key_func
        from bridge.informer.transform import drop_managed_fields
        from bridge.kube.listwatch import decode_watch_event

        cache = IndexedCache(key_func=meta_namespace_key_func,
                             indexers={"namespace": meta_namespace_index_func},
                             compact=variant == "bridge")
        transform = variant != "bridge_keep_managed"

        def add_bridge(line: bytes) -> None:
            obj = decode_watch_event(line).object
            cache.add(drop_managed_fields(obj) if transform else obj)

        return add_bridge, lambda: len(cache.list_keys())
    if variant == "naive_dict":
        plain: dict[str, Any] = {}

        def add_plain(line: bytes) -> None:
            obj = json.loads(line)["object"]
            meta = obj["metadata"]
            plain[f"{meta['namespace']}/{meta['name']}"] = obj

        return add_plain, lambda: len(plain)
    if variant == "naive_typed":
        import kubernetes

        api_client = kubernetes.client.ApiClient()
        typed: dict[str, Any] = {}

        def add_typed(line: bytes) -> None:
            body = orjson.dumps(orjson.loads(line)["object"]).decode()
            pod = api_client.deserialize(body, "V1Pod", "application/json")
            typed[f"{pod.metadata.namespace}/{pod.metadata.name}"] = pod

        return add_typed, lambda: len(typed)
    if variant == "raw_bytes":
        from bridge.informer.transform import drop_managed_fields

        raw: dict[str, bytes] = {}

        def add_raw(line: bytes) -> None:
            obj = orjson.loads(line)["object"]
            meta = obj["metadata"]
            # orjson's output keeps its growth buffer (about twice the length): copy it to its size.
            encoded = orjson.dumps(drop_managed_fields(obj))
            raw[f"{meta['namespace']}/{meta['name']}"] = bytes(memoryview(encoded))

        return add_raw, lambda: len(raw)
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def _child(variant: str, count: int) -> dict[str, Any]:
    lines = _api_json(count)
    objects = [orjson.loads(line)["object"] for line in lines[:200]]
    raw_full = sum(len(orjson.dumps(o)) for o in objects) / len(objects)
    for o in objects:
        o["metadata"].pop("managedFields", None)
    raw_trimmed = sum(len(orjson.dumps(o)) for o in objects) / len(objects)
    del objects
    add, size = _filler(variant)
    gc.collect()
    rss0 = rss_bytes()
    curve: list[dict[str, int]] = [{"objects": 0, "rss_delta": 0}]
    step = max(1, count // 10)
    t0 = time.perf_counter()
    for i, line in enumerate(lines, 1):
        add(line)
        if i % step == 0 or i == count:
            curve.append({"objects": i, "rss_delta": rss_bytes() - rss0})
    seconds = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_bytes()
    cached = size()
    # tracemalloc cross-check on a fresh cache of 1,000 objects.
    sample = _api_json(1000, offset=count)
    add_sample, _ = _filler(variant)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for line in sample:
        add_sample(line)
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    per_object = (rss1 - rss0) / max(1, cached)
    return {
        "variant": variant,
        "objects": cached,
        "fill_seconds": round(seconds, 2),
        "rss_delta_bytes": rss1 - rss0,
        "rss_bytes_per_object": round(per_object),
        "tracemalloc_bytes_per_object": round(traced / len(sample)),
        "raw_json_bytes_per_object": round(raw_full),
        "raw_json_bytes_without_managed_fields": round(raw_trimmed),
        "ratio_to_raw_json": round(per_object / raw_full, 2),
        "ratio_to_raw_json_without_managed_fields": round(per_object / raw_trimmed, 2),
        "curve": curve,
    }


def _measure(variant: str, count: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_memory", "child", variant, str(count)],
        capture_output=True, cwd=_REPO_ROOT, timeout=600, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}: child exited {proc.returncode}: {proc.stderr.decode()[-800:]}")
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


def run(quick: bool = False, results_dir: Path | None = None,
        variants: Sequence[str] = VARIANTS) -> dict[str, Any]:
    """Bytes per cached Pod for each variant (the bridge's cache with 100k Pods, the baselines with
    fewer: see ``_FULL_COUNTS``; quick: 2k, typed 300); writes ``memory.json``."""
    counts = _QUICK_COUNTS if quick else _FULL_COUNTS
    out: dict[str, Any] = {"quick": quick, "variants": {}}
    for variant in variants:
        n = counts[variant]
        try:
            out["variants"][variant] = _measure(variant, n)
        except Exception as exc:
            out["variants"][variant] = {"variant": variant, "error": f"{type(exc).__name__}: {exc}"}
    write_result("memory", out, results_dir)
    return out


def _main(argv: Sequence[str]) -> int:
    if len(argv) == 3 and argv[0] == "child":
        print(json.dumps(_child(argv[1], int(argv[2]))))
        return 0
    print(json.dumps(run(quick="--quick" in argv), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
