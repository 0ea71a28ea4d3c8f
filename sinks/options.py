"""Options common to every sink, validated once when the sink is built.

Every sink kind extends :class:`SinkOptions` with its own fields (brokers, URL, auth …) and builds
its options with :meth:`SinkOptions.from_mapping`, which turns pydantic's validation errors into one
:class:`~sinks.contract.SinkConfigError` whose message names the sink, its kind and the bad field,
e.g. ``sink 'audit' (kafka): destination: unknown template field 'foo' (known: …)``.

Defaults live here and nowhere else. The change filter by default ignores only
``metadata.resourceVersion`` and ``metadata.managedFields``: status-only updates *are* delivered
(many consumers watch readiness), while updates that change nothing but bookkeeping are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bridge.contracts import OverflowPolicy
from bridge.labels import parse_label_selector
from sinks.cel import CelError, compile_expression
from sinks.cloudevents import DEFAULT_KNATIVE_SOURCE
from sinks.contract import DeliveryOptions, EventType, SinkConfigError
from sinks.event_routing import EventRoute, EventRule
from sinks.filters import parse_path
from sinks.payload import PayloadMode
from sinks.templates import Template, TemplateError
from sinks.transport_security import InsecureSetting, refusal

__all__ = [
    "DEFAULT_IGNORE_PATHS",
    "BreakerOptions",
    "BufferOptions",
    "ChangeFilterOptions",
    "DeadLetterOptions",
    "EventRoutingOptions",
    "EventRuleOptions",
    "RedactOptions",
    "RetryOptions",
    "RoutingOptions",
    "SinkOptions",
    "delivery_options",
    "format_validation_error",
]

DEFAULT_IGNORE_PATHS = ("metadata.resourceVersion", "metadata.managedFields")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_paths(paths: list[str]) -> list[str]:
    for path in paths:
        parse_path(path)
    return paths


class EventRuleOptions(_Model):
    """One rule of ``routing.events`` (see :mod:`sinks.event_routing`): every condition set must hold."""

    reasons: list[str] = Field(default_factory=list)
    types: list[str] = Field(default_factory=list)
    involved_kinds: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    message: str | None = None
    """A regular expression searched in the Event's message (core) or note (events.k8s.io)."""
    min_count: int = Field(default=0, ge=0)
    involved_labels: str = ""
    """A label selector on the involved object's labels (the events profile's enrichment)."""

    @field_validator("involved_labels")
    @classmethod
    def _selector(cls, value: str) -> str:
        parse_label_selector(value)  # SelectorError (a ValueError) with the API server's message
        return value

    def rule(self) -> EventRule:
        selector = parse_label_selector(self.involved_labels) if self.involved_labels.strip() else None
        return EventRule.build(reasons=self.reasons, types=self.types, involved_kinds=self.involved_kinds,
                               namespaces=self.namespaces, message=self.message, min_count=self.min_count,
                               involved_labels=selector.matches if selector is not None else None)

    @model_validator(mode="after")
    def _compiles(self) -> Self:
        self.rule()
        return self


class EventRoutingOptions(_Model):
    """``routing.events``: Events accepted when a ``match`` rule (if any) and no ``drop`` rule matches."""

    match: list[EventRuleOptions] = Field(default_factory=list)
    drop: list[EventRuleOptions] = Field(default_factory=list)

    def route(self) -> EventRoute | None:
        if not (self.match or self.drop):
            return None
        return EventRoute(match=[r.rule() for r in self.match], drop=[r.rule() for r in self.drop])


class RoutingOptions(_Model):
    resources: list[str] = Field(default_factory=list)
    """Resources as users write them (``pods``, ``deployments.apps``); empty = all."""
    namespaces: list[str] = Field(default_factory=list)
    """Only these namespaces (cluster-scoped objects have none and are then excluded); empty = all."""
    exclude_namespaces: list[str] = Field(default_factory=list)
    label_selector: str = ""
    event_types: list[EventType] = Field(default_factory=list)
    """Empty = all types, snapshot markers included."""
    events: EventRoutingOptions = Field(default_factory=EventRoutingOptions)
    """Rules on what Kubernetes Events say (reason, type, involved kind, message); other resources
    pass them untouched."""

    @field_validator("label_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        parse_label_selector(value)  # SelectorError (a ValueError) with the API server's message
        return value


class ChangeFilterOptions(_Model):
    ignore_paths: list[str] = Field(default_factory=lambda: list(DEFAULT_IGNORE_PATHS))
    """Updates whose every change lies under these paths are filtered (e.g. add ``status``)."""
    only_paths: list[str] = Field(default_factory=list)
    """When set, only updates changing something under one of these paths are delivered."""

    _v = field_validator("ignore_paths", "only_paths")(_check_paths)


class RedactOptions(_Model):
    paths: list[str] = Field(default_factory=list)
    """Values replaced by ``<redacted>`` (mappings keep their keys)."""
    drop: list[str] = Field(default_factory=list)
    """Keys removed."""
    secrets: bool = True
    """Redact the values of core Secrets wherever they appear (``data``, ``stringData``, the
    last-applied annotation, annotations and labels quoting them)."""
    managed_fields: Literal["drop", "keep"] = "drop"

    _v = field_validator("paths", "drop")(_check_paths)


class BufferOptions(_Model):
    capacity: int = Field(default=1024, ge=1)
    """Notifications kept in memory for this sink in each informer (its in-memory budget)."""
    policy: Literal["spill", "coalesce", "drop", "block"] = "spill"
    """When the in-memory buffer is full: ``spill`` the backlog to disk in order (then degrade),
    ``coalesce`` to the latest state per object (then spill, then degrade), ``drop`` (counted), or
    ``block`` (backpressure that stalls the informer for every sink). See docs/sinks.md."""
    spill_limit: int = Field(default=256 << 20, ge=0)
    """Bytes of spill on disk this sink may use in each informer; 0 = no spill. Beyond it the sink
    alone degrades: latest state per object, delivered inside a gap window."""


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


class HeartbeatOptions(_Model):
    interval: float = Field(gt=0)
    """Seconds between two heartbeat events of one resource (a number, or ``30s``, ``5m``, ``1h``)."""

    @field_validator("interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str) and value[-1:] in _DURATION_UNITS:
            try:
                return float(value[:-1]) * _DURATION_UNITS[value[-1]]
            except ValueError:
                raise ValueError(f"not a duration: {value!r} (seconds, or 30s, 5m, 1h)") from None
        return value


class RetryOptions(_Model):
    initial: float = Field(default=0.2, ge=0)
    max: float = Field(default=30.0, ge=0)
    factor: float = Field(default=2.0, ge=1)
    jitter: float = Field(default=0.2, ge=0, le=1)
    """Each delay is multiplied by a random factor in ``[1 - jitter, 1 + jitter]``."""
    max_attempts: int = Field(default=0, ge=0)
    """Give up (dead-letter) after this many attempts; 0 = retry transient failures forever."""
    max_elapsed: float = Field(default=0.0, ge=0)
    """Give up after this many seconds of retrying; 0 = no limit."""
    max_retry_after: float = Field(default=300.0, ge=0)
    """Upper bound on a server's Retry-After."""

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.max < self.initial:
            raise ValueError(f"max ({self.max}) must be >= initial ({self.initial})")
        return self


class BreakerOptions(_Model):
    """The sink-level circuit breaker (see ``sinks.breaker``): after ``failures`` consecutive transient
    failures the events stop retrying on their own timers; one probe at a time asks the
    destination, and its success sends everything that waited, at once, in order."""

    enabled: bool = True
    failures: int = Field(default=5, ge=1)
    """Consecutive transient failures (no success between them) that open the breaker."""
    probe_interval: float = Field(default=0.25, gt=0)
    """Longest wait between two probes: they back off from ``retry.initial`` up to this. A server's
    Retry-After is honoured instead (up to ``retry.max_retry_after``)."""


class DeadLetterOptions(_Model):
    kind: Literal["none", "file", "kafka", "nats"] = "none"
    """Where permanent failures go; ``none`` drops them (counted as ``failed``)."""
    target: str = ""
    """File path, Kafka topic or NATS subject."""

    @model_validator(mode="after")
    def _target(self) -> Self:
        if self.kind != "none" and not self.target:
            raise ValueError(f"dead_letter kind {self.kind!r} needs a target")
        return self


class SinkOptions(_Model):
    """Options every sink understands."""

    routing: RoutingOptions = Field(default_factory=RoutingOptions)
    destination: str | None = None
    """Template for the topic / subject / URL path; None = the sink kind's default."""
    key: Literal["uid", "namespace/name"] = "uid"
    payload: PayloadMode = PayloadMode.OBJECT
    content_mode: Literal["structured", "binary"] = "structured"
    compat: Literal["native", "knative"] = "native"
    knative_source: str = DEFAULT_KNATIVE_SOURCE
    knative_mode: Literal["resource", "reference"] = "resource"
    """Knative ApiServerSource's ``mode``: the object as ``data``, or a reference to it."""
    change_filter: ChangeFilterOptions = Field(default_factory=ChangeFilterOptions)
    redact: RedactOptions = Field(default_factory=RedactOptions)
    buffer: BufferOptions = Field(default_factory=BufferOptions)
    max_in_flight: int = Field(default=1000, ge=1)
    resync_period: float = Field(default=0.0, ge=0)
    """Seconds between resync snapshots for this sink; 0 = off."""
    heartbeat: HeartbeatOptions | None = None
    """Heartbeat events (``io.kube-event-bridge.heartbeat``), one per resource every ``interval``,
    carrying the resource's current resourceVersion and what this sink acknowledged
    (docs/event-format.md); off unless set. Not in Knative mode."""
    retry: RetryOptions = Field(default_factory=RetryOptions)
    breaker: BreakerOptions = Field(default_factory=BreakerOptions)
    oversize: Literal["reference", "truncate", "dead_letter"] = "reference"
    """An event too large for the destination (after compression, where the sink compresses):
    ``reference`` sends an event carrying the object's identity and where the whole event is (the
    dead letter), ``truncate`` the object with the top-level fields that do not fit left out;
    both write the whole event to the dead letter. ``dead_letter`` sends nothing to the stream."""
    dead_letter: DeadLetterOptions = Field(default_factory=DeadLetterOptions)
    filter: str | None = None
    """A CEL expression (docs/filters.md): only events for which it is true go to this sink."""
    filter_errors: Literal["keep", "drop"] = "keep"
    """An event the filter fails on (a missing key read without ``has()``) is sent (``keep``) or
    filtered (``drop``); either way it is counted."""
    fields: list[str] = Field(default_factory=list)
    """Only these paths of the object are sent (after redaction); empty = the whole object."""

    allow_insecure: bool = False
    """Accept settings that weaken transport security (TLS verification off, credentials in
    plaintext to a host other than loopback: sinks/transport_security.py); refused without it, and
    warned about at start and by check-config with it."""

    _fields = field_validator("fields")(_check_paths)

    def insecure_settings(self) -> list[InsecureSetting]:
        """Settings of these options that weaken transport security (none by default)."""
        return []


    @field_validator("filter")
    @classmethod
    def _filter(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_expression(value)
            except CelError as exc:
                raise ValueError(str(exc)) from exc
        return value

    @field_validator("destination")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Template(value)
            except TemplateError as exc:
                raise ValueError(str(exc)) from exc
        return value

    @model_validator(mode="after")
    def _knative_payload(self) -> Self:
        if self.compat == "knative" and self.payload is not PayloadMode.OBJECT:
            raise ValueError("payload: compat 'knative' sends the object (or a reference to it), as "
                             "Knative's ApiServerSource does: use payload 'object'")
        if self.compat == "knative" and self.heartbeat is not None:
            raise ValueError("heartbeat: compat 'knative' sends only events of objects, as Knative's "
                             "ApiServerSource does: remove heartbeat or use compat 'native'")
        return self

    @classmethod
    def from_mapping(cls, name: str, mapping: Mapping[str, Any] | None, *, kind: str = "") -> Self:
        """Validates ``mapping``; raises SinkConfigError naming the sink, kind and field."""
        try:
            options = cls.model_validate(dict(mapping or {}))
        except pydantic.ValidationError as exc:
            raise SinkConfigError(format_validation_error(name, kind, exc)) from exc
        # After every other check (whose message is the more useful one when both apply).
        settings = options.insecure_settings()
        if settings and not options.allow_insecure:
            who = f"sink {name!r}" + (f" ({kind})" if kind else "")
            raise SinkConfigError(f"{who}: {refusal(settings)}")
        return options


def format_validation_error(name: str, kind: str, exc: pydantic.ValidationError) -> str:
    who = f"sink {name!r}" + (f" ({kind})" if kind else "")
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"]) or "options"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown option"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        problems.append(f"{loc}: {msg}")
    return f"{who}: " + "; ".join(problems)


class _DeliveryKeys(BaseModel):
    """The keys of a sink's options the bridge reads for its delivery (the others are the sink's)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    routing: RoutingOptions = Field(default_factory=RoutingOptions)
    buffer: BufferOptions = Field(default_factory=BufferOptions)
    resync_period: float = Field(default=0.0, ge=0)
    heartbeat: HeartbeatOptions | None = None


def delivery_options(options: Mapping[str, Any]) -> DeliveryOptions:
    """The bridge-side delivery options of a sink configured with ``options`` (its ``routing``,
    ``buffer`` and ``resync_period`` keys, whatever its kind); a bad value raises SinkConfigError
    naming the field."""
    try:
        keys = _DeliveryKeys.model_validate(dict(options))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SinkConfigError(f"{where}: {first['msg']}") from exc
    routing = frozenset(r.strip().lower() for r in keys.routing.resources)  # as the sink's routing filter
    return DeliveryOptions(routing=routing, buffer_capacity=keys.buffer.capacity,
                           overflow_policy=OverflowPolicy(keys.buffer.policy),
                           spill_limit=keys.buffer.spill_limit, resync_period=keys.resync_period,
                           heartbeat_interval=keys.heartbeat.interval if keys.heartbeat is not None else 0.0)
