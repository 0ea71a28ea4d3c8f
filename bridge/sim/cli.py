"""The simulator's command line, behind ``python -m bridge.sim`` and ``kube-event-bridge sim``.

Runs in its own process when a test needs an API server that outlives the bridge (crash tests), and
for the demo. Prints ``simulator listening on http://HOST:PORT`` once it serves, optionally writes a
kubeconfig for it, optionally generates churn, and stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Sequence
from typing import Any

from bridge.sim.apf import FlowControl
from bridge.sim.churn import ChurnGenerator, ChurnMix
from bridge.sim.events import EventGenerator
from bridge.sim.faults import FaultSpec, FaultTarget
from bridge.sim.server import Simulator
from bridge.sim.store import DEFAULT_HISTORY_SIZE

__all__ = ["build_parser", "sim_main"]


def _crd(text: str) -> dict[str, Any]:
    """``group/version/plural/Kind`` with an optional ``/cluster`` for cluster-scoped CRDs."""
    parts = text.split("/")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] not in ("cluster", "namespaced")):
        raise argparse.ArgumentTypeError(f"--crd {text!r}: expected group/version/plural/Kind[/cluster]")
    return {"group": parts[0], "version": parts[1], "plural": parts[2], "kind": parts[3],
            "namespaced": not (len(parts) == 5 and parts[4] == "cluster")}


def _forbidden(text: str) -> tuple[str, str]:
    """``plural`` (core group) or ``plural.group``."""
    plural, _, group = text.partition(".")
    return group, plural


def _denied(text: str) -> tuple[str, str, str]:
    """``verb:plural`` or ``verb:plural.group``."""
    verb, sep, resource = text.partition(":")
    if not sep or not verb or not resource:
        raise argparse.ArgumentTypeError(f"--deny {text!r}: expected VERB:RESOURCE (watch:pods)")
    group, plural = _forbidden(resource)
    return verb, group, plural


def build_parser(prog: str = "python -m bridge.sim") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Serve the kube-event-bridge API-server simulator.",
        epilog="At run time: GET/POST /_sim/faults, POST /_sim/compact, POST /_sim/expire-watches, "
               "POST /_sim/crds, GET /_sim/state.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    p.add_argument("--kubeconfig", metavar="PATH", help="write a kubeconfig for the simulator here")
    p.add_argument("--token", help="require this bearer token (written into the kubeconfig)")
    p.add_argument("--forbid", action="append", default=[], type=_forbidden, metavar="RESOURCE",
                   help="answer 403 for this resource (pods, deployments.apps); repeatable")
    p.add_argument("--deny", action="append", default=[], type=_denied, metavar="VERB:RESOURCE",
                   help="answer 403 for this verb on this resource only (watch:pods); repeatable")
    p.add_argument("--crd", action="append", default=[], type=_crd, metavar="G/V/PLURAL/KIND[/cluster]",
                   help="serve a CRD; repeatable")
    p.add_argument("--history-size", type=int, default=DEFAULT_HISTORY_SIZE,
                   help="changes kept per resource for watches and continue tokens")
    p.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between BOOKMARK events")
    p.add_argument("--too-large-wait", type=float, default=3.0,
                   help="seconds a request for a future resourceVersion waits before its 504")
    p.add_argument("--no-watch-list", action="store_true", help="reject sendInitialEvents (old server)")
    p.add_argument("--no-cache-pagination", action="store_true",
                   help='lists at resourceVersion "0" ignore limit (old watch cache)')
    apf = p.add_argument_group("priority and fairness (429 with Retry-After beyond a client's concurrency)")
    apf.add_argument("--apf-concurrency", type=int, default=None, metavar="N",
                     help="requests one client (bearer token, else User-Agent) may have executing at "
                          "once; watches are not counted (default: no limit)")
    apf.add_argument("--apf-queue-wait", type=float, default=0.0, metavar="SECONDS",
                     help="how long a request beyond the limit waits for a seat before its 429")
    apf.add_argument("--apf-queue-length", type=int, default=None, metavar="N",
                     help="requests of one client that may wait at once; beyond, 429 at once")
    apf.add_argument("--apf-retry-after", type=int, default=1, metavar="SECONDS",
                     help="the 429's Retry-After")
    churn = p.add_argument_group("churn")
    churn.add_argument("--churn-rate", type=float, default=0.0, help="events per second (0: no churn)")
    churn.add_argument("--churn-objects", type=int, default=100, help="target population")
    churn.add_argument("--churn-size", type=int, default=None, help="object size in bytes")
    churn.add_argument("--churn-mix", default="create=1,update=3,delete=1")
    churn.add_argument("--churn-resource", default="pods")
    churn.add_argument("--namespaces", default="default",
                       help="comma-separated namespaces for churn (created at start)")
    churn.add_argument("--seed", type=int, default=None)
    events = p.add_argument_group("Kubernetes Events (bridge.sim.events: series, both APIs, bursts)")
    events.add_argument("--events-rate", type=float, default=0.0,
                        help="Event changes per second: new Events, repetitions, expiries (0: none)")
    events.add_argument("--events-deployments", type=int, default=10, help="Deployments (involved objects)")
    events.add_argument("--events-pods", type=int, default=5, help="Pods per Deployment")
    events.add_argument("--events-max", type=int, default=5000, help="live Events before the oldest expire")
    events.add_argument("--events-new-api-share", type=float, default=0.5,
                        help="share of new Events written through events.k8s.io/v1")
    events.add_argument("--events-burst-every", type=float, default=0.0,
                        help="seconds between bursts (0: none)")
    events.add_argument("--events-burst-factor", type=float, default=5.0)
    events.add_argument("--events-burst-length", type=float, default=1.0)
    events.add_argument("--events-duration", type=float, default=0.0,
                        help="seconds of Event generation (0: until stopped)")
    events.add_argument("--events-wait-signal", action="store_true",
                        help="start generating on SIGUSR1 (a test starts its bridge first)")
    events.add_argument("--events-ledger", metavar="PATH",
                        help="append every new Event (uid, involved object, whether it existed), "
                             "Pod deletion and repetition (uid, count, time) as JSON lines")
    faults = p.add_argument_group("faults (also settable at run time: POST /_sim/faults)")
    faults.add_argument("--fault-watch-close-after", type=int, metavar="N")
    faults.add_argument("--fault-watch-cut-after", type=int, metavar="N")
    faults.add_argument("--fault-watch-garble-after", type=int, metavar="N")
    faults.add_argument("--fault-watch-expire-after", type=int, metavar="N")
    faults.add_argument("--fault-delay", type=float, default=0.0, metavar="SECONDS")
    faults.add_argument("--fault-error-code", type=int, choices=(429, 500, 503))
    faults.add_argument("--fault-error-count", type=int, default=0, metavar="K")
    faults.add_argument("--fault-error-retry-after", type=int, default=1, metavar="SECONDS")
    faults.add_argument("--fault-error-target", choices=[t.value for t in FaultTarget], default="any")
    return p


def _fault_spec(args: argparse.Namespace) -> FaultSpec:
    return FaultSpec(
        watch_close_after=args.fault_watch_close_after,
        watch_cut_after=args.fault_watch_cut_after,
        watch_garble_after=args.fault_watch_garble_after,
        watch_expire_after=args.fault_watch_expire_after,
        delay=args.fault_delay,
        error_code=args.fault_error_code,
        error_count=args.fault_error_count,
        error_retry_after=args.fault_error_retry_after,
        error_target=FaultTarget(args.fault_error_target),
    )


async def _run_events(events: EventGenerator, duration: float | None, go: asyncio.Event | None) -> None:
    if go is not None:
        await go.wait()
    stats = await events.run(duration)
    print(f"events done: {stats.changes} changes ({stats.created} created, {stats.bumped} repeated, "
          f"{stats.expired} expired)", flush=True)


async def _serve(args: argparse.Namespace) -> int:
    namespaces = [n.strip() for n in args.namespaces.split(",") if n.strip()]
    sim = Simulator(namespaces=dict.fromkeys(["default", "kube-system", *namespaces]),
        host=args.host, port=args.port, history_size=args.history_size,
        bookmark_interval=args.bookmark_interval, too_large_wait=args.too_large_wait,
        faults=_fault_spec(args), watch_list=not args.no_watch_list, crds=args.crd,
        cache_pagination=not args.no_cache_pagination,
        token=args.token, forbidden=args.forbid, denied=args.deny,
        flow_control=None if args.apf_concurrency is None else FlowControl(
            concurrency=args.apf_concurrency, queue_wait=args.apf_queue_wait,
            retry_after=args.apf_retry_after, queue_length=args.apf_queue_length),
    )
    churn: ChurnGenerator | None = None
    if args.churn_rate > 0:
        churn = ChurnGenerator(store=sim.store, rate=args.churn_rate, mix=ChurnMix.parse(args.churn_mix),
                               objects=args.churn_objects, object_size=args.churn_size,
                               namespaces=namespaces, seed=args.seed, resource=args.churn_resource)
        churn.prefill()
    events: EventGenerator | None = None
    if args.events_rate > 0:
        events = EventGenerator(store=sim.store, rate=args.events_rate, namespaces=namespaces,
                                deployments=args.events_deployments, pods_per_deployment=args.events_pods,
                                max_events=args.events_max, new_api_share=args.events_new_api_share,
                                burst_every=args.events_burst_every, burst_factor=args.events_burst_factor,
                                burst_length=args.events_burst_length, seed=args.seed,
                                ledger_path=args.events_ledger)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Only the main thread may install handlers; elsewhere the caller stops us another way.
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    url = await sim.start()
    churn_task: asyncio.Task[Any] | None = None
    try:
        if args.kubeconfig:
            sim.write_kubeconfig(args.kubeconfig)
        print(f"simulator listening on {url}", flush=True)
        if churn is not None:
            churn_task = asyncio.create_task(churn.run(), name="sim-churn")
            churn_task.add_done_callback(lambda t: None if t.cancelled() or t.exception() is None
                                         else stop.set())
        events_task = None
        go: asyncio.Event | None = None
        if events is not None and args.events_wait_signal:
            go = asyncio.Event()
            loop.add_signal_handler(signal.SIGUSR1, go.set)
            handled.append(signal.SIGUSR1)
        if events is not None:
            events_task = asyncio.create_task(
                _run_events(events, args.events_duration or None, go), name="sim-events")
            events_task.add_done_callback(lambda t: None if t.cancelled() or t.exception() is None
                                          else stop.set())
        await stop.wait()
        if events is not None and events_task is not None:
            events.stop()
            with contextlib.suppress(Exception):
                await events_task
            events.close()
    finally:
        if churn is not None and churn_task is not None:
            churn.stop()
            with contextlib.suppress(Exception):
                await churn_task
        await sim.stop()
        for sig in handled:
            loop.remove_signal_handler(sig)
    if churn_task is not None and not churn_task.cancelled() and churn_task.exception() is not None:
        print(f"churn generator failed: {churn_task.exception()!r}", file=sys.stderr)
        return 1
    return 0


def _freeze_after_full_collections(phase: str, info: dict[str, int]) -> None:
    """A ``gc.callbacks`` hook: after every full collection, what survived it is left out of the
    next ones (``gc.freeze``).

    The history (up to ``--history-size`` states of every object, each a tree of a few hundred
    dicts and lists) is acyclic and freed by reference counting; the cyclic collector only walks
    it. With 40,000 Pod states a full collection took 2 s of CPU, and on a loaded machine the
    simulator then answered nothing for 10-20 s (a fault schedule's churn stalled); frozen, each
    full collection walks only what came since the last one (25 ms)."""
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def sim_main(argv: Sequence[str] | None = None, *, prog: str = "python -m bridge.sim") -> int:
    """Entry point: parses ``argv`` (default ``sys.argv[1:]``), serves until SIGINT/SIGTERM.
    ``prog`` is the command name usage and errors show (``kube-event-bridge sim`` from the CLI)."""
    args = build_parser(prog).parse_args(list(argv) if argv is not None else None)
    if _freeze_after_full_collections not in gc.callbacks:
        gc.callbacks.append(_freeze_after_full_collections)
    try:
        return asyncio.run(_serve(args))
    except OSError as exc:
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2
