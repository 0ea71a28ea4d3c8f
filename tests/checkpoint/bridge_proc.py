"""A bridge in its own process, for the crash tests: ``python -m tests.checkpoint.bridge_proc …``.

Builds the same pipeline the service builds (discovery → SharedInformerFactory over the HTTP
ListerWatcher → BridgePipeline with a file, configmap or nats-kv checkpoint store) from command-line
arguments, with one sink (Kafka, or a JSON-lines file). Prints ``synced`` once every cache synced, and
``stopped`` after a graceful shutdown on SIGTERM; SIGKILL is what the crash test sends.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import signal
import sys
from typing import Any

from bridge.clock import RealClock
from bridge.delivery.checkpoint_writer import GroupCommit
from bridge.delivery.pipeline import BridgePipeline, WatchedResource
from bridge.informer.factory import InformerKey, SharedInformerFactory
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import HttpListerWatcher
from bridge.service.service import fetch_object
from bridge.storage.checkpoint import CheckpointStore, FileCheckpointStore
from bridge.storage.checkpoint_configmap import ConfigMapCheckpointStore
from bridge.storage.checkpoint_natskv import NatsKvCheckpointStore
from sinks.contract import ResourceRef
from sinks.registry import create_sink


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.checkpoint.bridge_proc")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--resource", default="configmaps")
    p.add_argument("--namespace", default="")
    p.add_argument("--label-selector", default="", help="scope the informer by a label selector (selector "
                                                          "exits are told apart as the service does)")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-store", choices=("file", "configmap", "nats-kv"), default="file")
    p.add_argument("--checkpoint-nats", help="nats-kv store: the NATS URL")
    p.add_argument("--checkpoint-namespace", default="default", help="configmap store: its namespace")
    p.add_argument("--checkpoint-interval", type=float, default=0.1)
    p.add_argument("--commit-events", type=int, default=0, help="group commit: acknowledgements that force a "
                                                                  "checkpoint write (0 = off)")
    p.add_argument("--commit-delay", type=float, default=0.2, help="group commit: seconds an "
                                                                   "acknowledgement may stay unsaved")
    p.add_argument("--journal-bytes", type=int, help="configmap / nats-kv store: the most one value of the "
                                                     "known-object journal holds (a chunk)")
    p.add_argument("--kafka", help="bootstrap servers (Kafka sink)")
    p.add_argument("--topic", help="Kafka topic")
    p.add_argument("--file", help="JSON-lines file (file sink) when no Kafka is given")
    p.add_argument("--sink", action="append", default=[], metavar="NAME=KIND:TARGET",
                   help="a named sink instead of --kafka/--file (repeatable): file:PATH or webhook:URL")
    p.add_argument("--spill-dir", help="the sinks' spill directory (none by default)")
    p.add_argument("--max-in-flight", type=int, default=32)
    p.add_argument("--buffer", type=int, default=32)
    p.add_argument("--cluster", default="crash")
    p.add_argument("--verbose", action="store_true", help="log the checkpoint progress twice a second")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    clock = RealClock()
    client = ApiClient.from_kubeconfig(args.kubeconfig, clock=clock)
    api = await Discovery(client=client).resolve(args.resource)
    key = InformerKey(resource=args.resource, namespace=args.namespace, label_selector=args.label_selector)
    ref = ResourceRef(group=api.group, version=api.version, resource=api.resource, kind=api.kind,
                      namespaced=api.namespaced)
    common: dict[str, Any] = {"max_in_flight": args.max_in_flight,
                              "buffer": {"capacity": args.buffer,
                                         "policy": "spill" if args.spill_dir else "block"}}
    sinks = []
    for spec in args.sink:
        name, _, rest = spec.partition("=")
        kind, _, target = rest.partition(":")
        if kind == "webhook":
            sinks.append(create_sink("webhook", name, {"url": target, **common,
                                                        "retry": {"initial": 0.05, "max": 0.2}}))
        else:
            sinks.append(create_sink("file", name, {"path": target, **common}))
    if sinks:
        sink = sinks[0]
    elif args.kafka:
        sink = create_sink("kafka", "kafka", {"brokers": args.kafka, "destination": args.topic,
                                              "linger_ms": 1, **common})
        sinks = [sink]
    else:
        sink = create_sink("file", "file", {"path": args.file, **common})
        sinks = [sink]

    # As the service runs by default: objects kept as bytes (RawObject) in a compact cache.
    def lister_watcher(k: InformerKey) -> HttpListerWatcher:
        return HttpListerWatcher(client=client, resource=api, namespace=k.namespace,
                                 label_selector=k.label_selector, raw_objects=True, drop_managed_fields=True)

    factory = SharedInformerFactory(lister_watcher_factory=lister_watcher, clock=clock, compact_cache=True)
    store: CheckpointStore
    journal: dict[str, Any] = {"journal_bytes": args.journal_bytes} if args.journal_bytes else {}
    if args.checkpoint_store == "configmap":
        store = ConfigMapCheckpointStore(client=client, namespace=args.checkpoint_namespace, **journal)
    elif args.checkpoint_store == "nats-kv":
        store = NatsKvCheckpointStore(nats_url=args.checkpoint_nats, **journal)
    else:
        store = FileCheckpointStore(directory=args.checkpoint_dir)

    pipeline = BridgePipeline(
        factory=factory, resources=[WatchedResource(key=key, api=api, ref=ref)], sinks=sinks,
        fetch_object=functools.partial(fetch_object, client),
        checkpoint_store=store, cluster=args.cluster,
        checkpoint_interval=args.checkpoint_interval, clock=clock, spill_directory=args.spill_dir,
        group_commit=(GroupCommit(events=args.commit_events, delay=args.commit_delay)
                      if args.commit_events else None),
    )
    stop = asyncio.Event()
    ident = WatchedResource(key=key, api=api, ref=ref).informer_id

    async def report() -> None:
        while True:
            await asyncio.sleep(0.5)
            t = pipeline.tracker(ident)
            logging.getLogger("bridge_proc").info(
                "rv=%s pending=%d lag=%d by_listener=%s sink=%s depth=%s", t.resource_version, t.pending,
                t.lag, t.pending_by_listener(), getattr(sink, "stats", None), pipeline.queue_depths())
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await pipeline.start()
        reporter = asyncio.create_task(report(), name="bridge-proc-report") if args.verbose else None
        if await pipeline.wait_for_sync(60):
            print("synced", flush=True)
        await stop.wait()
        if reporter is not None:
            reporter.cancel()
        await pipeline.shutdown(20)
        print("stopped", flush=True)
    finally:
        await client.close()
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(parse()))


if __name__ == "__main__":
    raise SystemExit(main())
