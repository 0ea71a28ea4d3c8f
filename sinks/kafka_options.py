"""The ``kafka`` sink's options and the librdkafka configuration they make: what the producer is
built with (:meth:`KafkaSinkOptions.producer_config`, the secret files read at start)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, Field, field_validator, model_validator

from sinks.addresses import check_kafka_brokers
from sinks.contract import SinkConfigError
from sinks.options import SinkOptions
from sinks.transport_security import InsecureSetting, all_loopback

__all__ = ["UNCOMPRESSED_CEILING", "KafkaSinkOptions", "LibrdkafkaValue", "read_secrets"]

LibrdkafkaValue = str | int | float | bool
UNCOMPRESSED_CEILING = 64 << 20
"""librdkafka's ``message.max.bytes`` when records are compressed: a record is judged by its
compressed size (``max_message_bytes``) here, not refused by librdkafka for its uncompressed one."""
_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]*")
_TEMPLATE_FIELD = re.compile(r"\{[^{}]*\}")


class KafkaSinkOptions(SinkOptions):
    """Options of the ``kafka`` sink (on top of :class:`~sinks.options.SinkOptions`)."""

    brokers: str = Field(min_length=1, validation_alias=AliasChoices("brokers", "bootstrap_servers"))
    """``bootstrap.servers``: ``host:port[,host:port…]`` (``bootstrap_servers`` is accepted too)."""

    @field_validator("brokers")
    @classmethod
    def _brokers(cls, value: str) -> str:
        return check_kafka_brokers(value)
    client_id: str = "kube-event-bridge"
    idempotent: bool = True
    acks: Literal["all", "1", "0"] = "all"
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    linger_ms: float = Field(default=1.0, ge=0)
    """How long librdkafka waits for more records before sending a batch. Every record waits that
    long before it is even sent, so it adds to each event's latency; under load batches fill while
    earlier requests are in flight anyway (up to five per broker)."""
    batch_size: int = Field(default=1_000_000, ge=1)
    """Maximum bytes of one record batch (``batch.size``)."""
    batch_num_messages: int = Field(default=10_000, ge=1)
    message_timeout_ms: int = Field(default=0, ge=0)
    """How long librdkafka may hold a record before failing it; 0 = forever (nothing is lost while
    the brokers are down). A bounded value dead-letters records that time out."""
    max_message_bytes: int = Field(default=1_000_000, ge=1000)
    """The topic's ``max.message.bytes``: a record larger once compressed takes the ``oversize``
    policy (keep it ≤ the topic's limit)."""
    dead_letter_max_message_bytes: int | None = Field(default=None, ge=1000)
    """Creates the dead-letter topic with this ``max.message.bytes``, and dead-letter records up
    to it keep the whole event (None: ``max_message_bytes``; larger records keep the reason only)."""
    queue_max_messages: int = Field(default=100_000, ge=1)
    """``queue.buffering.max.messages``: records held in librdkafka's local queue."""
    librdkafka: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    """Any librdkafka property, applied last (TLS: ``security.protocol``, ``ssl.ca.location`` …;
    SASL: ``sasl.mechanism`` PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512 / OAUTHBEARER,
    ``sasl.username``, ``sasl.oauthbearer.*`` …)."""
    secret_files: dict[str, str] = Field(default_factory=dict)
    """librdkafka property → file whose content (stripped) is its value, e.g.
    ``{"sasl.password": "/var/run/secrets/kafka/password"}``. Read at start."""
    auto_create_topics: bool = False
    """Create missing topics (events, snapshot, dead letter) with the settings below."""
    topic_partitions: int = Field(default=6, ge=1)
    topic_replication_factor: int = Field(default=-1)
    """-1 = the broker's default."""
    topic_config: dict[str, str] = Field(default_factory=dict)
    snapshot_topic: str | None = None
    """A compacted topic receiving every object's latest state keyed per object, with a tombstone
    on delete: a materialised view of the watched resources."""
    snapshot_topic_config: dict[str, str] = Field(default_factory=dict)
    """Extra topic settings for the snapshot topic (``cleanup.policy=compact`` is always set)."""
    connect_timeout: float = Field(default=5.0, gt=0)
    """Seconds ``start`` waits for a first metadata answer (a broker that is down does not fail
    start; it only leaves the sink unhealthy)."""

    def insecure_settings(self) -> list[InsecureSetting]:
        props = {k.lower(): v for k, v in self.librdkafka.items()}
        found: list[InsecureSetting] = []
        if str(props.get("enable.ssl.certificate.verification", "true")).lower() in ("false", "0"):
            found.append(("librdkafka.enable.ssl.certificate.verification",
                          "turns TLS certificate verification off"))
        brokers = [b.strip() for b in self.brokers.split(",") if b.strip()]
        if (str(props.get("security.protocol", "")).lower() == "sasl_plaintext"
                and not all_loopback(brokers, "kafka")):
            found.append(("librdkafka.security.protocol",
                          "SASL_PLAINTEXT sends the SASL credentials (and every record) in plaintext "
                          "to brokers other than loopback: use SASL_SSL"))
        return found

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.idempotent and self.acks != "all":
            raise ValueError(f"acks: an idempotent producer needs acks 'all' (got {self.acks!r}); "
                             "set idempotent: false to use another value")
        if self.topic_replication_factor == 0 or self.topic_replication_factor < -1:
            raise ValueError("topic_replication_factor must be -1 (broker default) or >= 1")
        if self.snapshot_topic is not None and not self.snapshot_topic:
            raise ValueError("snapshot_topic must not be empty")
        topics = [("destination", self.destination), ("snapshot_topic", self.snapshot_topic)]
        if self.dead_letter.kind == "kafka":
            topics.append(("dead_letter.target", self.dead_letter.target))
        for what, text in topics:
            if text is None:
                continue
            literal = _TEMPLATE_FIELD.sub("", text) if what == "destination" else text
            if not text or not _TOPIC_CHARS.fullmatch(literal) or len(text) > 249:
                raise ValueError(f"{what}: {text!r} is not a valid Kafka topic name (at most 249 of "
                                 "a-z A-Z 0-9 . _ -)")
        return self

    def producer_config(self) -> dict[str, LibrdkafkaValue]:
        """The librdkafka configuration (secret files not yet read)."""
        conf: dict[str, LibrdkafkaValue] = {
            "bootstrap.servers": self.brokers,
            "client.id": self.client_id,
            "enable.idempotence": self.idempotent,
            "acks": self.acks,
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "batch.size": self.batch_size,
            "batch.num.messages": self.batch_num_messages,
            "message.timeout.ms": self.message_timeout_ms,
            "message.max.bytes": self.max_message_bytes if self.compression == "none" else max(
                self.max_message_bytes, self.dead_letter_max_message_bytes or 0, UNCOMPRESSED_CEILING),
            "queue.buffering.max.messages": self.queue_max_messages,
            # TCP_NODELAY, as the Java client always sets: with Nagle's algorithm on (librdkafka's
            # default) a small produce request can wait for the ACK of the previous one.
            "socket.nagle.disable": True,
        }
        conf.update(self.librdkafka)
        return conf


def read_secrets(files: dict[str, str], who: str) -> dict[str, str]:
    """librdkafka property → the (stripped) content of its file, for ``secret_files``."""
    out: dict[str, str] = {}
    for prop, path in files.items():
        try:
            out[prop] = Path(path).read_text().strip()
        except OSError as exc:
            raise SinkConfigError(
                f"{who}: secret_files[{prop!r}]: cannot read {path!r}: {exc.strerror}"
            ) from exc
    return out
