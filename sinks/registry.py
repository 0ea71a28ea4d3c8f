"""Sink kinds by name: the built-in ones and third-party plugins, found through entry points.

A configuration names each sink by kind (``kafka``, ``nats``, ``webhook`` …). Kinds come from the
entry-point group ``kube_event_bridge.sinks`` (each entry point names a class with a
``from_options(name, options)`` classmethod, or any ``factory(name, options)`` callable), plus kinds
registered at run time with :func:`register` (tests, embedding applications). Run-time registrations
win over entry points of the same name.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

from sinks.contract import SINK_ENTRY_POINT_GROUP, Sink, SinkConfigError, SinkFactory

__all__ = ["create_sink", "known_kinds", "load_factory", "register", "unregister"]

_registered: dict[str, SinkFactory] = {}


def register(kind: str, factory: SinkFactory) -> None:
    """Makes ``kind`` available to :func:`create_sink` (replacing an earlier registration)."""
    _registered[kind] = factory


def unregister(kind: str) -> None:
    _registered.pop(kind, None)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=SINK_ENTRY_POINT_GROUP)}


def known_kinds() -> list[str]:
    return sorted(set(_entry_points()) | set(_registered))


def load_factory(kind: str) -> SinkFactory:
    """The factory for ``kind``; raises SinkConfigError for unknown or unloadable kinds."""
    factory = _registered.get(kind)
    if factory is not None:
        return factory
    ep = _entry_points().get(kind)
    if ep is None:
        raise SinkConfigError(f"unknown sink kind {kind!r} (known kinds: {', '.join(known_kinds())})")
    try:
        target: Any = ep.load()
    except Exception as exc:
        raise SinkConfigError(f"sink kind {kind!r} could not be loaded from {ep.value}: {exc}") from exc
    from_options = getattr(target, "from_options", None)
    built: SinkFactory = from_options if callable(from_options) else target
    return built


def create_sink(kind: str, name: str, options: Mapping[str, Any] | None = None) -> Sink:
    """Builds a sink of ``kind`` named ``name``; raises SinkConfigError for bad kinds or options."""
    factory = load_factory(kind)
    try:
        sink = factory(name, options or {})
    except SinkConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise SinkConfigError(f"sink {name!r} ({kind}): {exc}") from exc
    if not isinstance(sink, Sink):
        raise SinkConfigError(f"sink kind {kind!r} built {type(sink).__name__}, which is not a Sink")
    return sink
