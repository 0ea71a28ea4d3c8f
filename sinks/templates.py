"""Destination templates: the topic, subject or URL path a sink sends an event to.

A template is plain text with fields in braces, e.g. ``k8s.{namespace}.{resource}`` or
``/hooks/{group}/{kind}/{labels[app]}``. Templates are compiled once, when the sink is built, so an
unknown field is a configuration error at start rather than a failure per event. Field values are
passed through a sink-specific sanitiser (NATS tokens may not contain dots or wildcards, Kafka topics
allow a small alphabet, URL paths need percent-encoding); the literal text is the user's and is kept.
"""

from __future__ import annotations

import re
import string
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from sinks.contract import ChangeEvent

__all__ = [
    "TEMPLATE_FIELDS",
    "IdentityRenderer",
    "Sanitizer",
    "Template",
    "TemplateError",
    "identity",
    "sanitize_kafka_topic",
    "sanitize_nats_token",
    "sanitize_url_segment",
]

TEMPLATE_FIELDS = ("cluster", "group", "version", "resource", "kind", "namespace", "name", "uid", "labels")
"""Fields a template may name; ``labels`` needs a key: ``{labels[app]}``."""

Sanitizer = Callable[[str], str]
IdentityRenderer = Callable[[ChangeEvent, str, str, str], str]
"""See :meth:`Template.identity_renderer`."""


class TemplateError(ValueError):
    """The template text is malformed or names an unknown field."""


def identity(value: str) -> str:
    return value


_NATS_BAD = re.compile(r"[.*>\s\x00-\x1f\x7f]")
_KAFKA_BAD = re.compile(r"[^a-zA-Z0-9._-]")


def sanitize_nats_token(value: str) -> str:
    """One NATS subject token: dots, wildcards and whitespace become ``_``; empty becomes ``_``."""
    return _NATS_BAD.sub("_", value) or "_"


def sanitize_kafka_topic(value: str) -> str:
    """Characters outside Kafka's topic alphabet ``[a-zA-Z0-9._-]`` become ``_``."""
    return _KAFKA_BAD.sub("_", value)


def sanitize_url_segment(value: str) -> str:
    """Percent-encodes everything but unreserved characters, so a value stays one path segment."""
    return urllib.parse.quote(value, safe="")


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    key: str | None = None


_FIELD_RE = re.compile(r"^(?P<name>[a-z]+)(?:\[(?P<key>[^\[\]]+)\])?$")


class Template:
    """A compiled destination template."""

    __slots__ = ("_parts", "_static", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[str | _Field] = []
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise TemplateError(f"malformed template {text!r}: {exc}") from exc
        for literal, field_name, spec, conversion in parsed:
            if literal:
                parts.append(literal)
            if field_name is None:
                continue
            if spec or conversion:
                raise TemplateError(f"template field {{{field_name}}} takes no format spec or conversion")
            match = _FIELD_RE.match(field_name)
            if match is None or match["name"] not in TEMPLATE_FIELDS:
                known = ", ".join(f"{{{f}}}" for f in TEMPLATE_FIELDS if f != "labels")
                raise TemplateError(
                    f"unknown template field {field_name!r} (known: {known}, {{labels[KEY]}})"
                )
            name, key = match["name"], match["key"]
            if name == "labels" and key is None:
                raise TemplateError("template field 'labels' needs a label key: {labels[app]}")
            if name != "labels" and key is not None:
                raise TemplateError(f"template field {name!r} takes no [key]")
            parts.append(_Field(name, key))
        self._parts = tuple(parts)
        self._static = all(isinstance(p, str) for p in parts)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._parts if isinstance(p, _Field))

    @property
    def static(self) -> bool:
        """True when the template has no field: every event renders to :attr:`text`."""
        return self._static

    def identity_renderer(self, sanitize: Sanitizer = identity,
                          memo: dict[str, str] | None = None) -> IdentityRenderer | None:
        """``render(event, sanitize)`` for a caller that has the object's namespace, name and uid
        (a RawObject's fields): ``renderer(event, namespace, name, uid)``. None when the template
        reads labels. Each value's sanitised form is kept in ``memo`` (``sanitize`` must be a
        function of the value alone; the caller bounds the memo's size)."""
        if any(isinstance(p, _Field) and p.name == "labels" for p in self._parts):
            return None
        # (literal, None) or ("", field name): no isinstance test per part and event.
        parts = tuple((p, None) if isinstance(p, str) else ("", p.name) for p in self._parts)
        known: dict[str, str] = {} if memo is None else memo

        def render(event: ChangeEvent, namespace: str, name: str, uid: str) -> str:
            out: list[str] = []
            for literal, field in parts:
                if field is None:
                    out.append(literal)
                    continue
                if field == "namespace":
                    value = namespace
                elif field == "name":
                    value = name
                elif field == "uid":
                    value = uid
                elif field == "cluster":
                    value = event.cluster
                else:  # group, version, resource, kind
                    value = getattr(event.resource, field)
                clean = known.get(value)
                if clean is None:
                    clean = known[value] = sanitize(value)
                out.append(clean)
            return "".join(out)

        return render

    def render(self, event: ChangeEvent, sanitize: Sanitizer = identity) -> str:
        if self._static:
            return self.text
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(sanitize(_value(event, part)))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"


def _value(event: ChangeEvent, field: _Field) -> str:
    name = field.name
    res = event.resource
    if name == "group":
        return res.group
    if name == "version":
        return res.version
    if name == "resource":
        return res.resource
    if name == "kind":
        return res.kind
    if name == "namespace":
        return event.namespace
    if name == "name":
        return event.name
    if name == "uid":
        return event.uid
    if name == "cluster":
        return event.cluster
    labels = event.metadata.get("labels")
    if isinstance(labels, dict) and field.key is not None:
        return str(labels.get(field.key) or "")
    return ""
