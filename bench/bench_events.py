"""The ``events`` scenario: Kubernetes Events through the bridge with the events profile, against the
same run without it.

* **throughput** — the bridge (``BridgeService``, as it ships) runs in a child process pinned to one
  core, watching both Event APIs and writing to a file sink; the simulator runs in this process, on
  the other core. Once the bridge is ready, the simulator makes a burst of Event changes
  (:class:`bridge.sim.events.EventGenerator`: new Events of both APIs about Pods, Deployments and
  ReplicaSets, repetitions, Pods deleted and re-created) as fast as it can; the watch history holds
  what the bridge has not read yet. Event changes/s = changes / time from the first to the last
  line the file sink wrote, once the last state of every Event is in the file (the bridge merges
  repetitions of one Event still waiting for a sink when it is behind: the CloudEvents written are
  reported too). ``profile``: ``profile: events`` with enrichment (metadata caches
  of Pods, ReplicaSets and Deployments, owner chains); ``plain``: the same resources without it.
* **memory** — N Events (and the Pods, ReplicaSets and Deployments they name) exist before the
  bridge starts; the child's resident memory once every Event was delivered (its initial list),
  minus its resident memory before the service started, per Event; with the profile it includes
  the enrichment's caches (their entry counts are reported).

Run it with ``python -m bench.run --only events`` (``--quick`` for small sizes).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import rss_bytes, write_result

__all__ = ["run"]

_ROOT = str(Path(__file__).resolve().parent.parent)


def _config(kubeconfig: Path, out: Path, profile: bool, page_size: int = 500) -> dict[str, Any]:
    resources: list[dict[str, Any]] = [{"resource": "events"}, {"resource": "events.events.k8s.io"}]
    if profile:
        for r in resources:
            r["profile"] = "events"
    return {
        "cluster": "bench",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false", "page_size": page_size},
        "resources": resources,
        "events": {"enrichment": {"kinds": ["pods", "replicasets.apps", "deployments.apps"]}},
        "sinks": [{"name": "file", "kind": "file", "path": str(out)}],
        "checkpoint": {"store": "file", "directory": str(out.parent / "checkpoints"), "interval": 0.5},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "logging": {"level": "warning"},
    }


# ---- the child: the bridge, on one core ------------------------------------------------------------


def _read_from(path: Path, offset: int) -> bytes:
    """The file's bytes from ``offset`` (a local file the sink appends to: a short blocking read);
    none while it does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


def _checkpoints(directory: Path) -> int:
    return len(list(directory.glob("*.ckpt"))) if directory.exists() else 0


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def _child(config_path: str, mode: str) -> None:
    """``prime``: start, sync, stop (a checkpoint is written); ``measure``: start (from that
    checkpoint, if any), and time the sink's file until it holds every expected (uid,
    resourceVersion) pair, which the parent sends on stdin at once."""
    from bridge.service.config import load_config
    from bridge.service.events.profile import EventsStage
    from bridge.service.service import BridgeService, configure_gc

    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {0})
    configure_gc()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=256 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
        sys.stdout.buffer.flush()

    config = load_config(config_path)
    out = Path(config.sinks[0].options()["path"])
    expect: set[tuple[str, str]] = set()
    if mode == "measure":
        expect = {(u, rv) for u, rv in orjson.loads(await reader.readline())["expect"]}
    gc.collect()
    rss_before = rss_bytes()
    offset = _size(out)
    service = BridgeService(config=config)
    task = asyncio.create_task(service.run(), name="bench-events-service")
    if mode == "prime":
        checkpoints = Path(config.checkpoint.directory)
        # Ready, and a checkpoint written for both informers: the next start resumes from them.
        while not (service.readiness().ready and _checkpoints(checkpoints) >= 2):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        service.stop_event.set()
        await task
        say({"primed": True})
        return
    first = last = 0.0
    seen = 0
    pending = b""
    while expect:
        await asyncio.sleep(0.02)
        chunk = _read_from(out, offset)
        if not chunk:
            continue
        offset += len(chunk)
        now = time.perf_counter()
        first = first or now
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            ce = orjson.loads(line)
            seen += 1
            expect.discard((ce["uid"], ce["resourceversion"]))
        last = now
    gc.collect()
    rss_after = rss_bytes()
    enricher = None
    for chain in service._state.sinks:
        for stage in chain.stages:
            if isinstance(stage, EventsStage):
                enricher = stage.profile.enricher or enricher
    caches = {f"{g}/{k}": len(s.live) for (g, k), s in enricher.caches.items()} if enricher else {}
    service.stop_event.set()
    await task
    say({"delivered": seen, "seconds": last - first, "rss_before": rss_before, "rss_after": rss_after,
         "caches": caches})


# ---- the parent: the simulator and the measurement --------------------------------------------------


async def _spawn(cfg: Path, mode: str, tmp: Path, expect: list[tuple[str, str]] | None) -> dict[str, Any]:
    with (tmp / f"child-{mode}.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.bench_events", "child", str(cfg), mode, cwd=_ROOT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log)
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        if expect is not None:
            proc.stdin.write(orjson.dumps({"expect": expect}) + b"\n")
            await proc.stdin.drain()
        async with asyncio.timeout(1800):
            line = await proc.stdout.readline()
        if not line:
            log_text = (tmp / f"child-{mode}.log").read_text()
            raise RuntimeError(f"the bridge's process failed: {log_text[-2000:]}")
        await proc.wait()
        result: dict[str, Any] = orjson.loads(line)
        return result
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _one(*, profile: bool, changes: int, prefill: bool, tmp: Path) -> dict[str, Any]:
    from bridge.sim import Simulator
    from bridge.sim.events import EventGenerator

    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {1})
    out = tmp / f"{'profile' if profile else 'plain'}-{'memory' if prefill else 'throughput'}.jsonl"
    async with Simulator(history_size=changes + 200_000, bookmark_interval=3600.0) as sim:
        deployments = max(10, changes // 200) if prefill else 100
        gen = EventGenerator(store=sim.store, rate=1.0, namespaces=["web", "shop", "batch"],
                             deployments=deployments, pods_per_deployment=10, max_events=changes + 1,
                             new_share=1.0 if prefill else 0.3, lifecycle_share=0.0 if prefill else 0.02,
                             seed=26)
        if prefill:
            while gen.stats.changes < changes:
                gen.step()
        kubeconfig = sim.write_kubeconfig(tmp / "kubeconfig")
        cfg = tmp / "bridge.json"
        # Large pages for the memory run: the simulator re-sorts its whole store for each page, which
        # would make 400 pages of 500 Events its cost, not the bridge's.
        cfg.write_bytes(orjson.dumps(_config(kubeconfig, out, profile, 100_000 if prefill else 500)))
        generated = 0.0
        if not prefill:
            # The bridge syncs and stops (its checkpoint is before the burst), the burst is made, and
            # the bridge resumes from the checkpoint: its watch replays the burst as fast as it reads.
            await _spawn(cfg, "prime", tmp, None)
            t0 = time.perf_counter()
            while gen.stats.changes < changes:
                for _ in range(200):
                    gen.step()
                await asyncio.sleep(0)
            generated = time.perf_counter() - t0
        finals = [(o["metadata"]["uid"], o["metadata"]["resourceVersion"])
                  for r in ("events", "events.events.k8s.io") for o in sim.store.list(r)]
        result = await _spawn(cfg, "measure", tmp, finals)
    result["changes"] = gen.stats.changes
    result["events"] = gen.stats.created
    if result["seconds"] > 0:
        result["changes_per_second"] = round(gen.stats.changes / result["seconds"])
    result["generation_seconds"] = round(generated, 3)
    if result["seconds"] > 0:
        result["delivered_per_second"] = round(result["delivered"] / result["seconds"])
    result["rss_delta_mb"] = round((result["rss_after"] - result["rss_before"]) / 2**20, 1)
    grown = result["rss_after"] - result["rss_before"]
    result["bytes_per_event"] = round(grown / max(1, gen.stats.changes))
    return result


def run(quick: bool = False, results_dir: Path | None = None) -> dict[str, Any]:
    throughput_changes = 5_000 if quick else 30_000
    memory_events = 10_000 if quick else 200_000
    results: dict[str, Any] = {"throughput": {}, "memory": {}, "cpus": os.cpu_count(),
                               "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="keb-bench-events-") as d:
        tmp = Path(d)
        for profile in (False, True):
            name = "profile" if profile else "plain"
            (tmp / name).mkdir()
            results["throughput"][name] = asyncio.run(
                _one(profile=profile, changes=throughput_changes, prefill=False, tmp=tmp / name))
            (tmp / f"{name}-mem").mkdir()
            results["memory"][name] = asyncio.run(
                _one(profile=profile, changes=memory_events, prefill=True, tmp=tmp / f"{name}-mem"))
    t = results["throughput"]
    if t["plain"].get("changes_per_second") and t["profile"].get("changes_per_second"):
        ratio = t["profile"]["changes_per_second"] / t["plain"]["changes_per_second"]
        results["throughput_ratio"] = round(ratio, 3)
    m = results["memory"]
    results["memory_extra_mb"] = round(m["profile"]["rss_delta_mb"] - m["plain"]["rss_delta_mb"], 1)
    write_result("events", results, results_dir)
    return results


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "child":
        asyncio.run(_child(sys.argv[2], sys.argv[3]))
    else:
        print(orjson.dumps(run(quick="--quick" in sys.argv), option=orjson.OPT_INDENT_2).decode())
