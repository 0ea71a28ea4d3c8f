"""``kube-event-bridge demo``: the whole product on one machine, with nothing to install or configure.

Starts the API-server simulator with a churn of realistic Pods, runs the real service against it (the
same code path as ``run``: discovery, informers, checkpoints, health endpoint) with two sinks — stdout
(updates as JSON merge patches, so they stay readable) and a JSON-lines file with full events — and
reports progress on stderr. At the end it checks what a consumer would: replaying the file's events
reproduces the simulator's final state.

The simulator is a cluster kubectl can use: the demo writes ``demo.kubeconfig`` beside the events file
for as long as it runs and prints how to point kubectl at it; Deployments are watched too, so
``kubectl apply -f examples/deployment.yaml`` shows up among the events.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bridge.service.config import BridgeConfig
from bridge.service.logconfig import configure_logging
from bridge.service.service import BridgeService, configure_gc
from bridge.sim import ChurnGenerator, Simulator

__all__ = ["replay", "run_demo"]

NAMESPACES = ("default", "web")
RESOURCES = ("pods", "deployments.apps")
"""What the demo's bridge watches: the churned Pods, and Deployments for a kubectl user to apply."""


def _say(text: str) -> None:
    sys.stderr.write(f"demo: {text}\n")
    sys.stderr.flush()


def replay(path: Path) -> tuple[dict[str, str], Counter[str]]:
    """Applies the CloudEvents in a JSON-lines file in order: ``subject → resourceVersion`` of every
    Pod still alive at the end, and the count of events per type (of every kind)."""
    state: dict[str, str] = {}
    counts: Counter[str] = Counter()
    if not path.exists():
        return state, counts
    with path.open("rb") as fh:
        for line in fh:
            ev: dict[str, Any] = orjson.loads(line)
            kind = str(ev.get("type", "")).rsplit(".", 1)[-1]
            if str(ev.get("type", "")).endswith(("snapshot.begin", "snapshot.end")):
                counts["snapshot marker"] += 1
                continue
            if str(ev.get("type", "")).endswith(("gap.begin", "gap.end")):
                counts["gap marker"] += 1
                continue
            counts[kind] += 1
            if ev.get("kind", "Pod") != "Pod":
                continue
            subject = str(ev.get("subject", ""))
            if kind == "deleted":
                state.pop(subject, None)
            else:
                state[subject] = str(ev.get("resourceversion", ""))
    return state, counts


async def _demo(*, duration: float, rate: float, objects: int, output: Path, quiet: bool,
                seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="keb-demo-") as tmp:
        async with Simulator(namespaces=dict.fromkeys(("default", "kube-system", *NAMESPACES)),
                             bookmark_interval=1.0) as sim:
            kubeconfig = sim.write_kubeconfig(output.parent / "demo.kubeconfig")
            churn = ChurnGenerator(store=sim.store, rate=rate, objects=objects, object_size=1500,
                                   mix="create=3,update=5,delete=2",
                                   namespaces=NAMESPACES, seed=seed)
            created = churn.prefill()
            _say(f"simulator at {sim.url} with {created} pods")
            _say(f"point kubectl at it from another terminal:  export KUBECONFIG={kubeconfig}")
            _say("  then e.g.  kubectl get pods -A   kubectl apply -f examples/deployment.yaml   "
                 "kubectl get deployments")
            config = _demo_config(kubeconfig=kubeconfig, tmp=Path(tmp), output=output, quiet=quiet)
            service = BridgeService(config=config)
            service_task = asyncio.create_task(service.run(), name="demo-bridge")
            churn_task: asyncio.Task[Any] | None = None
            started = time.monotonic()
            try:
                # Readiness is computed from informers and sinks; there is no event to await.
                while service.readiness().reasons and not service_task.done():  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
                if service_task.done():
                    return service_task.result() or 1
                _say(f"bridge synced {created} pods in {time.monotonic() - started:.1f}s; "
                     f"health and metrics on http://127.0.0.1:{service.health.port}/metrics")
                churn_task = asyncio.create_task(churn.run(duration=duration or None), name="demo-churn")
                last = time.monotonic()
                while not churn_task.done():
                    await asyncio.wait({churn_task}, timeout=2.0)
                    if time.monotonic() - last >= 2.0 or churn_task.done():
                        last = time.monotonic()
                        _say(_progress(service, churn))
            except asyncio.CancelledError:
                churn.stop()
            finally:
                if churn_task is not None:
                    churn.stop()
                    with contextlib.suppress(asyncio.CancelledError):
                        await churn_task
                # Let the sinks catch up with the last changes, then stop like SIGTERM would.
                await _wait_caught_up(service, sim, timeout=10.0)
                service.stop_event.set()
                code = await service_task
            kubeconfig.unlink(missing_ok=True)  # the cluster it points at is going away
            return _report(output, sim, code)


def _demo_config(*, kubeconfig: Path, tmp: Path, output: Path, quiet: bool) -> BridgeConfig:
    """The bridge's configuration for the demo: every demo resource, to ``output`` (and stdout
    unless ``quiet``), with its checkpoints and spill under ``tmp``."""
    sinks: list[dict[str, Any]] = [
        {"name": "file", "kind": "file", "path": str(output)},
    ]
    if not quiet:
        sinks.append({"name": "stdout", "kind": "stdout", "payload": "merge_patch"})
    return BridgeConfig(
        cluster="demo",
        kubernetes={"kubeconfig": str(kubeconfig), "in_cluster": "false"},  # type: ignore[arg-type]
        resources=[{"resource": r} for r in RESOURCES],  # type: ignore[misc]
        sinks=sinks,  # type: ignore[arg-type]
        checkpoint={"store": "file", "directory": str(tmp / "checkpoints"),  # type: ignore[arg-type]
                    "interval": 1.0, "spill_directory": str(tmp / "spill")},
        server={"host": "127.0.0.1", "port": 0, "admin_port": 0},  # type: ignore[arg-type]
        logging={"level": "warning", "format": "text"},  # type: ignore[arg-type]
    )


def _report(output: Path, sim: Simulator, code: int) -> int:
    """Says what ``output`` holds and whether replaying it gives the simulator's pods; the exit
    code (``code``, or 1 when the replay differs)."""
    state, counts = replay(output)
    expected = {f"{m['namespace']}/{m['name']}": m["resourceVersion"]
                for m in (o["metadata"] for o in sim.store.list("pods"))}
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    _say(f"{sum(counts.values())} events in {output} ({summary})")
    if state == expected:
        _say(f"replaying {output} reproduces the simulator's {len(expected)} pods exactly")
    else:
        missing = len(set(expected.items()) - set(state.items()))
        _say(f"replay differs from the simulator in {missing} pods")
        code = code or 1
    return code


def _delivered(service: BridgeService) -> int:
    pipeline = service._state.pipeline
    if pipeline is None:
        return 0
    return sum(c.get("delivered", 0) for c in pipeline.stats().sinks.values())


def _progress(service: BridgeService, churn: ChurnGenerator) -> str:
    pipeline = service._state.pipeline
    cached = 0
    if pipeline is not None:
        cached = sum(len(inf.get_indexer().list_keys()) for inf in pipeline.informers.values())
    s = churn.stats
    return (f"changes made {s.total} (+{s.created} ~{s.updated} -{s.deleted}), cached pods {cached}, "
            f"events delivered {_delivered(service)}")


async def _wait_caught_up(service: BridgeService, sim: Simulator, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    target = sim.store.resource_version
    while time.monotonic() < deadline:
        pipeline = service._state.pipeline
        if pipeline is None:
            return
        rvs = [inf.last_sync_resource_version() for inf in pipeline.informers.values()]
        lag = sum(pipeline.stats().checkpoint_lag.values())
        if rvs and all(rv and int(rv) >= target for rv in rvs) and lag == 0:
            return
        await asyncio.sleep(0.1)


def run_demo(*, duration: float = 15.0, rate: float = 20.0, objects: int = 30,
             output: str = "demo-events.jsonl", quiet: bool = False, seed: int = 7) -> int:
    configure_logging("warning", "text")
    configure_gc()
    Path(output).unlink(missing_ok=True)
    try:
        return asyncio.run(_demo(duration=duration, rate=rate, objects=objects, output=Path(output).resolve(),
                                 quiet=quiet, seed=seed))
    except KeyboardInterrupt:
        return 130
