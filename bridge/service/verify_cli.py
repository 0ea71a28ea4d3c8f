"""``kube-event-bridge verify``: the command around :mod:`bridge.service.verify`.

Turns the command line (and, optionally, the bridge's configuration file) into what to read, reads the
sink and lists the cluster, prints the report, and maps the verdict to the exit code: 0 the sink's
state equals the cluster's, 1 it differs, 2 bad usage or something could not be read — a message
naming what, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
import sys
from pathlib import Path
from typing import Any

import orjson

from bridge.errors import BridgeError
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
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


_FIELD = re.compile(r"\{([a-z]+)\}")
_TOPIC_FIELDS = frozenset({"cluster", "group", "version", "resource", "kind"})
_READABLE = ("file", "kafka", "jetstream")


def _secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror}") from exc


async def _from_sink_config(args: argparse.Namespace, sink: dict[str, Any], cluster: str,
                            requests: list[ResourceRequest], client: ApiClient) -> None:
    """Fills the source flags from the bridge's sink configuration ``--sink`` names."""
    name, kind = sink["name"], sink["kind"]
    if kind not in _READABLE:
        raise UsageError(f"sink {name!r} is a {kind} sink, which cannot be read back; verify what its "
                         "receiver stored instead (e.g. --file with the receiver's JSON lines)")
    if kind == "file":
        args.file = args.file or sink.get("path")
        return
    if kind == "kafka":
        await _kafka_from_sink(args, sink, cluster, requests, client)
        return
    _jetstream_from_sink(args, sink)


async def _kafka_from_sink(args: argparse.Namespace, sink: dict[str, Any], cluster: str,
                           requests: list[ResourceRequest], client: ApiClient) -> None:
    """The brokers, the client settings and (unless ``--topic`` names them) the topics of the
    resources, from a Kafka sink's configuration."""
    name = sink["name"]
    args.kafka = args.kafka or sink.get("brokers") or sink.get("bootstrap_servers")
    conf = {str(k): str(v) for k, v in (sink.get("librdkafka") or {}).items()}
    for prop, path in (sink.get("secret_files") or {}).items():
        conf[str(prop)] = _secret(str(path), f"sink {name!r}: secret_files[{prop!r}]")
    args.kafka_config = conf
    if args.topic:
        return
    template = str(sink.get("destination") or "k8s.{resource}")
    fields = set(_FIELD.findall(template))
    if not fields <= _TOPIC_FIELDS:
        raise UsageError(f"sink {name!r}: its destination {template!r} depends on each object "
                         f"({', '.join(sorted(fields - _TOPIC_FIELDS))}); name the topics with --topic")
    from sinks.templates import sanitize_kafka_topic

    discovery = Discovery(client=client)
    for req in requests:
        api = await discovery.resolve(req.resource)
        values = {"cluster": cluster, "group": api.group, "version": api.version,
                  "resource": api.resource, "kind": api.kind}
        topic = template
        for field_name, value in values.items():
            topic = topic.replace("{" + field_name + "}", sanitize_kafka_topic(value))
        if topic not in args.topic:
            args.topic.append(topic)


def _jetstream_from_sink(args: argparse.Namespace, sink: dict[str, Any]) -> None:
    """The servers, the stream and the connection's credentials and TLS, from a JetStream sink's
    configuration."""
    name = sink["name"]
    args.jetstream = args.jetstream or ",".join(sink.get("servers") or [])
    stream = sink.get("stream") or {}
    args.stream = args.stream or stream.get("name")
    if not args.stream:
        raise UsageError(f"sink {name!r} names no stream (stream.name); give it with --stream")
    connect: dict[str, Any] = {}
    if sink.get("user") and sink.get("password_file"):
        connect["user"] = sink["user"]
        connect["password"] = _secret(sink["password_file"], f"sink {name!r}: password_file")
    if sink.get("token_file"):
        connect["token"] = _secret(sink["token_file"], f"sink {name!r}: token_file")
    if sink.get("creds_file"):
        connect["user_credentials"] = sink["creds_file"]
    if sink.get("nkey_seed_file"):
        connect["nkeys_seed"] = sink["nkey_seed_file"]
    if sink.get("tls_ca_file") or sink.get("tls_cert_file"):
        try:
            ctx = ssl.create_default_context(cafile=sink.get("tls_ca_file"))
            if sink.get("tls_cert_file") and sink.get("tls_key_file"):
                ctx.load_cert_chain(sink["tls_cert_file"], sink["tls_key_file"])
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"sink {name!r}: TLS files: {exc}") from exc
        connect["tls"] = ctx
        if sink.get("tls_hostname"):
            connect["tls_hostname"] = sink["tls_hostname"]
    args.nats_connect = connect


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
    args.sink_config = None
    if args.sink and not args.config:
        raise UsageError("--sink names a sink of the bridge's configuration: give it with --config")
    if args.config:
        from bridge.service.config import load_config

        cfg = load_config(args.config)
        if args.sink:
            match = [s for s in cfg.sinks if s.name == args.sink]
            if not match:
                raise UsageError(f"--sink {args.sink!r}: the configuration has no such sink (sinks: "
                                 f"{', '.join(s.name for s in cfg.sinks)})")
            args.sink_config = {"name": match[0].name, "kind": match[0].kind, **match[0].options()}
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
        return await asyncio.to_thread(read_kafka, args.kafka, args.topic, timeout=args.timeout,
                                       config=getattr(args, "kafka_config", None))
    if args.jetstream:
        if not args.stream:
            raise UsageError("--jetstream needs --stream")
        return await read_jetstream(args.jetstream, args.stream, timeout=args.timeout,
                                    connect=getattr(args, "nats_connect", None))
    raise UsageError("name the sink to read: --sink NAME (with --config), --file PATH, "
                     "--kafka BROKERS --topic TOPIC, or --jetstream SERVERS --stream NAME")


async def verify_from_args(args: argparse.Namespace) -> VerifyReport:
    """Reads the sink and the cluster as the flags say and compares them."""
    if args.topic and not (args.kafka or args.sink):
        raise UsageError("--topic is only meaningful with --kafka")
    if args.stream and not (args.jetstream or args.sink):
        raise UsageError("--stream is only meaningful with --jetstream")
    requests, cluster, client = _requests(args)
    try:
        if args.sink_config is not None:
            await _from_sink_config(args, args.sink_config, cluster or "default", requests, client)
        # The sink first, then the cluster: an object changed between the two reads shows as stale,
        # never as a state the sink cannot have reached yet.
        contents = await _read_sink(args)
        async with asyncio.timeout(args.timeout):
            objects = await list_cluster(client, requests)
    finally:
        await client.close()
    return verify(sink=contents.description, events=contents.events, cluster=objects, cluster_name=cluster,
                  undecodable=contents.undecodable,
                  strict=not args.allow_order_violations)


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
