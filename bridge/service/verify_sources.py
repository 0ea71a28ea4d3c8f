"""Where ``kube-event-bridge verify`` reads from: what a sink holds, and what the cluster holds.

Each sink is read back with its destination's own client, from the beginning, in the order the
destination keeps (the order a consumer would replay): a JSON-lines file line by line (rotated files
``path.N`` … ``path.1`` first), every partition of Kafka topics from offset 0 up to the high
watermark read at the start and then until the topic is quiet for a second (confluent-kafka,
partitions assigned, no consumer group joined), a
JetStream stream from its first sequence up to the last one at the start (nats-py, an ordered
consumer). Both content modes are understood: a structured CloudEvent, or binary mode with the
attributes in ``ce_`` (Kafka) / ``ce-`` (NATS) headers.

Both sides are decoded exactly, as the bridge decodes objects (msgspec, integers of any size kept:
:mod:`bridge.service.verify_values`), so that a sink that rounded a number can be told from one that
kept it.

The cluster side lists each resource through the bridge's own API access (kubeconfig or in-cluster
service account, discovery, paginated lists), so it sees what the bridge's informers see, and keeps
each object (without ``metadata.managedFields``, with its resource's ``apiVersion`` and ``kind``, as
the bridge sends it) for the comparison of values.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.errors import ApiStatusError, ConfigurationError
from bridge.jsonbounds import MAX_DEPTH
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import Discovery
from bridge.service.verify import ClusterObject, ResourceScope, SinkEvent
from bridge.service.verify_values import UndecodableError, decode

if TYPE_CHECKING:
    from confluent_kafka import Consumer

__all__ = ["SinkContents", "list_cluster", "read_file", "read_jetstream", "read_kafka"]


@dataclass(slots=True)
class SinkContents:
    """The events read back, in the destination's order, and the records that were not events."""

    description: str
    events: list[SinkEvent] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)


class SourceError(ConfigurationError):
    """The sink cannot be read (a missing file, an unknown topic or stream, an unreachable broker)."""


_RECORD_DEPTH = MAX_DEPTH + 8
"""The deepest record read back: an event's envelope (and ``{"object", "oldObject"}``) around an
object as deep as the bridge decodes; a deeper record is not one of the bridge's events."""
_PAGE_DEPTH = MAX_DEPTH + 2
"""The deepest List page decoded: a List and its ``items`` around objects as deep as the bridge
decodes (a deeper one it quarantines)."""


def _decode(body: bytes | None, headers: Sequence[tuple[str, bytes]], prefix: str) -> dict[str, Any] | None:
    """A CloudEvent from a record: structured body, or binary-mode headers + data body."""
    if body:
        try:
            value = decode(body, max_depth=_RECORD_DEPTH)
        except UndecodableError:
            value = None
        if isinstance(value, dict) and "specversion" in value:
            return value
    ce: dict[str, Any] = {}
    for name, raw in headers:
        lname = name.lower()
        text = raw.decode("utf-8", "replace")
        if lname.startswith(prefix):
            ce[lname[len(prefix):]] = urllib.parse.unquote(text)
        elif lname == "content-type":
            ce["datacontenttype"] = text
    if "specversion" not in ce:
        return None
    try:
        ce["data"] = decode(body, max_depth=_RECORD_DEPTH) if body else None
    except UndecodableError:
        return None
    return ce


# --------------------------------------------------------------------------------------------------
# file


def read_file(path: str | Path) -> SinkContents:
    """Every line of a file sink's output (and its rotated files, oldest first)."""
    base = Path(path)
    if not base.exists():
        raise SourceError(f"--file {base}: no such file")
    rotated = sorted((p for p in base.parent.glob(base.name + ".*") if p.suffix[1:].isdigit()),
                     key=lambda p: -int(p.suffix[1:]))
    out = SinkContents(description=f"file {base}")
    for p in [*rotated, base]:
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise SourceError(f"cannot read {p}: {exc.strerror}") from exc
        for n, line in enumerate(data.split(b"\n"), start=1):
            if not line.strip():
                continue
            ce = _decode(line, (), "")
            if ce is None:
                out.undecodable.append(f"{p.name}:{n}")
            else:
                out.events.append(SinkEvent(ce=ce, position=f"{p.name}:{n}"))
    return out


# --------------------------------------------------------------------------------------------------
# Kafka


def read_kafka(bootstrap: str, topics: Sequence[str], *, timeout: float = 30.0, idle: float = 1.0,
               config: Mapping[str, str] | None = None) -> SinkContents:
    """Every record of ``topics``: up to each partition's high watermark at the start, then until
    no record came for ``idle`` seconds (blocking)."""
    from confluent_kafka import Consumer, KafkaException

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": "kube-event-bridge-verify",
                            "enable.auto.commit": False, "enable.partition.eof": False,
                            "auto.offset.reset": "earliest", **(config or {})}
    try:
        consumer = Consumer(conf)
    except KafkaException as exc:
        raise SourceError(f"cannot read Kafka at {bootstrap}: {exc}") from exc
    out = SinkContents(description=f"kafka {bootstrap} topic(s) {', '.join(topics)}")
    try:
        highs = _high_watermarks(consumer, topics, bootstrap=bootstrap, timeout=timeout)
        by_partition = _consume(consumer, highs, out, timeout=timeout, idle=idle) if highs else {}
        for tp in sorted(by_partition):
            out.events.extend(by_partition[tp])
    except KafkaException as exc:
        raise SourceError(f"reading Kafka at {bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()
    return out


def _high_watermarks(consumer: Consumer, topics: Sequence[str], *, bootstrap: str,
                     timeout: float) -> dict[tuple[str, int], int]:
    """(topic, partition) → its high watermark, for every partition of ``topics`` holding records."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        md = consumer.list_topics(timeout=min(timeout, 10.0))
    except KafkaException as exc:
        raise SourceError(f"cannot reach the Kafka brokers {bootstrap}: {exc}") from exc
    highs: dict[tuple[str, int], int] = {}
    for topic in topics:
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            raise SourceError(f"Kafka topic {topic!r} does not exist on {bootstrap}")
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                highs[(topic, p)] = int(high)
    return highs


def _consume(consumer: Consumer, highs: dict[tuple[str, int], int], out: SinkContents, *,
             timeout: float, idle: float) -> dict[tuple[str, int], list[SinkEvent]]:
    """The events of every partition of ``highs``, read from its start (records that do not decode
    go to ``out.undecodable``)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    by_partition: dict[tuple[str, int], list[SinkEvent]] = {}
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in highs])
    pos = dict.fromkeys(highs, -1)
    deadline = time.monotonic() + timeout
    last_message = time.monotonic()
    # Up to every high watermark read at the start, then until nothing came for ``idle``
    # seconds: some brokers (Tansu) report a watermark that counts only the first record of
    # the newest batch, so the watermark alone may stop short.
    while (any(pos[tp] + 1 < highs[tp] for tp in highs)
           or time.monotonic() - last_message < idle):
        if time.monotonic() > deadline:
            short = {f"{t}/{p}": f"{pos[(t, p)] + 1}/{highs[(t, p)]}" for t, p in highs
                     if pos[(t, p)] + 1 < highs[(t, p)]}
            raise SourceError(f"reading Kafka timed out after {timeout} s (read/high: {short})")
        for msg in consumer.consume(num_messages=1000, timeout=0.1):
            if msg.error() is not None:
                continue
            last_message = time.monotonic()
            tp = (str(msg.topic()), int(msg.partition() or 0))
            offset = int(msg.offset() or 0)
            if offset <= pos.get(tp, -1):
                continue
            pos[tp] = offset
            where = f"{tp[0]}/{tp[1]}@{offset}"
            raw_headers: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
            headers = [(str(k), v if isinstance(v, bytes) else str(v or "").encode())
                       for k, v in raw_headers]
            raw = msg.value()
            body = raw.encode() if isinstance(raw, str) else raw
            ce = _decode(body, headers, "ce_")
            if ce is None:
                out.undecodable.append(where)
            else:
                by_partition.setdefault(tp, []).append(SinkEvent(ce=ce, position=where))
    return by_partition


# --------------------------------------------------------------------------------------------------
# JetStream


async def read_jetstream(servers: str, stream: str, *, timeout: float = 30.0,
                         connect: Mapping[str, Any] | None = None) -> SinkContents:
    """Every message of ``stream`` from its first sequence to its last one at the start.
    ``connect``: more ``nats.connect`` arguments (credentials, TLS)."""
    import nats
    from nats.errors import Error as NatsError
    from nats.errors import NoServersError
    from nats.js.errors import NotFoundError

    try:
        nc = await nats.connect(servers=servers.split(","), connect_timeout=min(timeout, 5.0),
                                max_reconnect_attempts=1, allow_reconnect=False, **(connect or {}))
    except (NoServersError, NatsError, OSError, TimeoutError) as exc:
        raise SourceError(f"cannot reach NATS at {servers}: {exc}") from exc
    out = SinkContents(description=f"jetstream {servers} stream {stream}")
    try:
        js = nc.jetstream(timeout=timeout)
        try:
            info = await js.stream_info(stream)
        except NotFoundError as exc:
            raise SourceError(f"JetStream stream {stream!r} does not exist on {servers}") from exc
        last = int(info.state.last_seq)
        if int(info.state.messages) == 0:
            return out
        sub = await js.subscribe("", stream=stream, ordered_consumer=True)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    msg = await sub.next_msg(timeout=timeout)
                    seq = int(msg.metadata.sequence.stream)
                    headers = [(k, v.encode()) for k, v in (msg.headers or {}).items()]
                    ce = _decode(msg.data, headers, "ce-")
                    where = f"{stream}#{seq}"
                    if ce is None:
                        out.undecodable.append(where)
                    else:
                        out.events.append(SinkEvent(ce=ce, position=where))
                    if seq >= last:
                        break
        except TimeoutError as exc:
            raise SourceError(f"reading stream {stream!r} timed out after {timeout} s "
                              f"({len(out.events)} of up to {info.state.messages} messages)") from exc
        finally:
            await sub.unsubscribe()
    except NatsError as exc:
        raise SourceError(f"reading stream {stream!r} from {servers} failed: {exc}") from exc
    finally:
        await nc.close()
    return out


# --------------------------------------------------------------------------------------------------
# the cluster


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """One resource to verify, as written under ``resources:``."""

    resource: str
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""


async def list_cluster(client: ApiClient, requests: Sequence[ResourceRequest], *, page_size: int = 500,
                       ) -> dict[ResourceScope, list[ClusterObject]]:
    """Lists every requested resource (all pages) through discovery and the API client."""
    discovery = Discovery(client=client)
    out: dict[ResourceScope, list[ClusterObject]] = {}
    for req in requests:
        api = await discovery.resolve(req.resource)
        scope = ResourceScope(name=req.resource, api_version=api.api_version, kind=api.kind,
                              namespace=req.namespace if api.namespaced else "")
        selectors: dict[str, str | int | bool | None] = {}
        if req.label_selector:
            selectors["labelSelector"] = req.label_selector
        if req.field_selector:
            selectors["fieldSelector"] = req.field_selector
        params: dict[str, str | int | bool | None] = {"limit": page_size, **selectors}
        objects: list[ClusterObject] = []
        while True:
            context = f"verify: list {api.qualified}"
            page = _page(await client.request_bytes("GET", api.path(req.namespace or None), params=params,
                                                    context=context), context)
            objects.extend(_listed(item, scope) for item in page.get("items") or []
                           if isinstance(item, dict))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            params = {"limit": page_size, "continue": token, **selectors}
        out[scope] = objects
    return out


def _page(raw: bytes, context: str) -> dict[str, Any]:
    """A List page, decoded exactly."""
    try:
        page = decode(raw, max_depth=_PAGE_DEPTH)
    except UndecodableError as exc:
        raise ApiStatusError(f"{context}: the server answered JSON the verifier cannot read ({exc})",
                             code=200) from exc
    if not isinstance(page, dict):
        raise ApiStatusError(f"{context}: expected a JSON object, got {type(page).__name__}", code=200)
    return page


def _listed(item: dict[str, Any], scope: ResourceScope) -> ClusterObject:
    """A List item as the bridge sends it (``apiVersion`` and ``kind`` filled in, ``managedFields``
    cut), with its identity."""
    meta = item.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    if "managedFields" in meta:
        meta = {k: v for k, v in meta.items() if k != "managedFields"}
        item = {**item, "metadata": meta}
    item.setdefault("apiVersion", scope.api_version)
    item.setdefault("kind", scope.kind)
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    return ClusterObject(uid=str(meta.get("uid") or ""), key=f"{ns}/{name}" if ns else name,
                         resource_version=str(meta.get("resourceVersion") or ""), obj=item)
