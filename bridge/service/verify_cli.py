"""``kube-event-bridge verify``: the command around :mod:`bridge.service.verify`.

Turns the command line (and, optionally, the bridge's configuration file) into what to read, reads the
sink and lists the cluster, prints the report, and maps the verdict to the exit code: 0 the sink's
state equals the cluster's, 1 it differs, 2 bad usage or something could not be read — a message
naming what, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

from bridge.errors import BridgeError
from bridge.kube.apiclient import ApiClient
from bridge.service.verify import VerifyReport, verify
from bridge.service.verify_sources import (
    ResourceRequest,
    SinkContents,
    list_cluster,
    read_file,
    read_jetstream,
    read_kafka,
)

__all__ = ["UsageError", "run_verify"]

EXIT_CONSISTENT = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The command line does not say what to verify."""


def _requests(args: argparse.Namespace) -> tuple[list[ResourceRequest], str | None, ApiClient]:
    """The resources, the cluster name and the API client, from the flags over the config."""
    requests: list[ResourceRequest] = []
    for text in args.resource:
        name, _, ns = text.partition("@")
        if not name:
            raise UsageError(f"--resource {text!r}: expected RESOURCE or RESOURCE@NAMESPACE")
        requests.append(ResourceRequest(resource=name, namespace=ns))
    cluster: str | None = args.cluster
    kubeconfig, context, in_cluster = args.kubeconfig, args.context, "auto"
    if args.config:
        from bridge.service.config import load_config

        cfg = load_config(args.config)
        if not requests:
            requests = [ResourceRequest(resource=r.resource, namespace=r.namespace,
                                        label_selector=r.label_selector, field_selector=r.field_selector)
                        for r in cfg.resources]
        cluster = cluster or cfg.cluster
        kubeconfig = kubeconfig or cfg.kubernetes.kubeconfig
        context = context or cfg.kubernetes.context
        in_cluster = cfg.kubernetes.in_cluster if not args.kubeconfig else "false"
    if not requests:
        raise UsageError("nothing to verify: name the resources with --resource, or give the bridge's "
                         "configuration with --config")
    if in_cluster == "true":
        client = ApiClient.in_cluster()
    elif in_cluster == "false":
        client = ApiClient.from_kubeconfig(kubeconfig, context)
    else:
        client = ApiClient.auto(kubeconfig=kubeconfig, context=context)
    return requests, cluster, client


async def _read_sink(args: argparse.Namespace) -> SinkContents:
    if args.file:
        return await asyncio.to_thread(read_file, args.file)
    if args.kafka:
        if not args.topic:
            raise UsageError("--kafka needs at least one --topic")
        return await asyncio.to_thread(read_kafka, args.kafka, args.topic, timeout=args.timeout)
    if args.jetstream:
        if not args.stream:
            raise UsageError("--jetstream needs --stream")
        return await read_jetstream(args.jetstream, args.stream, timeout=args.timeout)
    raise UsageError("name the sink to read: --file PATH, --kafka BROKERS --topic TOPIC, or "
                     "--jetstream SERVERS --stream NAME")


async def verify_from_args(args: argparse.Namespace) -> VerifyReport:
    """Reads the sink and the cluster as the flags say and compares them."""
    if args.topic and not args.kafka:
        raise UsageError("--topic is only meaningful with --kafka")
    if args.stream and not args.jetstream:
        raise UsageError("--stream is only meaningful with --jetstream")
    requests, cluster, client = _requests(args)
    try:
        # The sink first, then the cluster: an object changed between the two reads shows as stale,
        # never as a state the sink cannot have reached yet.
        contents = await _read_sink(args)
        async with asyncio.timeout(args.timeout):
            objects = await list_cluster(client, requests)
    finally:
        await client.close()
    return verify(sink=contents.description, events=contents.events, cluster=objects, cluster_name=cluster,
                  undecodable=contents.undecodable, strict=args.strict)


def run_verify(args: argparse.Namespace) -> int:
    try:
        report = asyncio.run(verify_from_args(args))
    except UsageError as exc:
        sys.stderr.write(f"kube-event-bridge verify: {exc}\n")
        return EXIT_USAGE
    except BridgeError as exc:
        sys.stderr.write(f"kube-event-bridge verify: {exc}\n")
        return EXIT_USAGE
    except TimeoutError:
        sys.stderr.write(f"kube-event-bridge verify: listing the cluster took longer than {args.timeout} s\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(report.render())
    return EXIT_CONSISTENT if report.ok else EXIT_MISMATCH
