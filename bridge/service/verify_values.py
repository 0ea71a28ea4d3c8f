"""What a sink holds of an object against what the cluster holds: the values ``verify`` compares.

:mod:`bridge.service.verify` finds an object *stale* by its resourceVersion. At the same
resourceVersion the sink's state must also hold the cluster's values: a sink that changed one (an
integer beyond 2^53 or 64 bits rounded through a float, a string cut short) holds an *altered*
object, which a resourceVersion alone cannot show.

Invariants of the comparison (:func:`first_difference`):

* Both sides are decoded exactly (:func:`decode`, msgspec, as the bridge decodes objects): an
  integer of any size stays a Python ``int``. orjson turns one beyond 64 bits into a float, which
  two different integers share, so such a sink could not be told from an exact one.
* Every member the sink holds must be in the cluster's object with an equal value, recursively; a
  list must have the cluster's length and equal items. Members the sink lacks are not differences:
  a sink's ``fields`` projection and ``redact.drop`` rules, an oversized object's reference or
  truncation and a quarantined object's identity leave members out by design.
* A string holding :data:`REDACTED` stands for any value (``redact.paths``, a Secret's values, the
  annotations quoting them: sinks/redaction.py).
* ``metadata.managedFields`` is compared on neither side (sinks drop it by default).
* Numbers compare by their exact value (``1`` and ``1.0`` are one JSON number; an ``int`` and a
  ``float`` compare exactly in Python, so 2^53 + 1 is not the float 2^53); a boolean equals only a
  boolean, null only null.
* A difference is reported by its path and its kind, never by its values: the cluster's value may
  be a Secret's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from bridge.jsonbounds import exceeds_depth

__all__ = ["REDACTED", "UndecodableError", "decode", "first_difference"]

REDACTED = "<redacted>"
"""What a sink writes in place of a redacted value (sinks/redaction.py ``REDACTED``)."""

_decoder = msgspec.json.Decoder()
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


class UndecodableError(ValueError):
    """The bytes are not JSON, or nest deeper than the limit given to :func:`decode`."""


def decode(raw: bytes, *, max_depth: int) -> Any:
    """The JSON value of ``raw``, integers exact; deeper than ``max_depth`` levels is refused before
    the recursive decoder sees it (bridge/jsonbounds.py)."""
    if exceeds_depth(raw, max_depth):
        raise UndecodableError(f"nested deeper than {max_depth} levels")
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise UndecodableError(str(exc)) from exc


def first_difference(sink: Mapping[str, Any], cluster: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(path, kind)`` of the first value the sink's object holds that is not the cluster's (module
    docs), None when it holds none. ``kind``: ``value``, ``list length``, ``not in the cluster's
    object``."""
    return _walk(_without_managed_fields(sink), _without_managed_fields(cluster), "")


def _without_managed_fields(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _walk(sink: Any, cluster: Any, path: str) -> tuple[str, str] | None:
    if isinstance(sink, str) and REDACTED in sink:
        return None
    if isinstance(sink, Mapping):
        if not isinstance(cluster, Mapping):
            return (path, "value")
        for key, value in sink.items():
            below = _member(path, str(key))
            if key not in cluster:
                return (below, "not in the cluster's object")
            found = _walk(value, cluster[key], below)
            if found is not None:
                return found
        return None
    if isinstance(sink, Sequence) and not isinstance(sink, str):
        if not isinstance(cluster, Sequence) or isinstance(cluster, str):
            return (path, "value")
        if len(sink) != len(cluster):
            return (path, "list length")
        for i, (a, b) in enumerate(zip(sink, cluster, strict=True)):
            found = _walk(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if _same_scalar(sink, cluster) else (path, "value")


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b  # exact between int and float
    return type(a) is type(b) and bool(a == b)


def _member(path: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_quoted(key)}]"


def _quoted(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
