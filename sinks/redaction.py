"""Redaction: keep secrets and bulk out of what leaves the cluster.

By default a Secret's ``data`` and ``stringData`` values are replaced by :data:`REDACTED` (the keys
stay, so consumers still see which keys changed), and ``metadata.managedFields`` is dropped (it is
~20% of a typical object and no consumer wants it). Users add paths to redact (value replaced; for a
mapping every value replaced, keys kept; for a list every item replaced) or to drop (key removed).

Objects are shared by every sink and must not be mutated, so redaction copies on write: only the
mappings along a redacted path are copied, the rest of the tree is shared with the original.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bridge.rawobject import RawObject
from sinks.contract import ResourceRef
from sinks.filters import WILDCARD, Path, is_mapping, parse_path

__all__ = ["REDACTED", "Redactor"]

REDACTED = "<redacted>"

_SECRET_PATHS: tuple[Path, ...] = (("data",), ("stringData",))
_MANAGED_FIELDS: Path = ("metadata", "managedFields")


def _redact_value(value: Any) -> Any:
    if is_mapping(value):
        return dict.fromkeys(value, REDACTED)
    if isinstance(value, list):
        return [REDACTED] * len(value)
    return REDACTED


def _apply(node: Any, path: Path, drop: bool) -> Any:
    """Returns ``node`` with ``path`` redacted or dropped, copying only what changes."""
    if not path:
        return node
    head, rest = path[0], path[1:]
    if is_mapping(node):
        keys = list(node) if head == WILDCARD else ([head] if head in node else [])
        if not keys:
            return node
        out = dict(node)
        for key in keys:
            if rest:
                out[key] = _apply(node[key], rest, drop)
            elif drop:
                del out[key]
            else:
                out[key] = _redact_value(node[key])
        return out
    if isinstance(node, list) and head == WILDCARD:
        if rest:
            return [_apply(item, rest, drop) for item in node]
        return [] if drop else [_redact_value(item) for item in node]
    return node


class Redactor:
    """Applies the configured redactions to an object (never mutating it)."""

    __slots__ = ("_drop_kept_bytes", "drop", "redact", "secrets")

    def __init__(
        self,
        *,
        redact_paths: Iterable[str] = (),
        drop_paths: Iterable[str] = (),
        redact_secrets: bool = True,
        drop_managed_fields: bool = True,
    ) -> None:
        self.redact: tuple[Path, ...] = tuple(parse_path(p) for p in redact_paths)
        drop = [parse_path(p) for p in drop_paths]
        if drop_managed_fields and _MANAGED_FIELDS not in drop:
            drop.append(_MANAGED_FIELDS)
        self.drop: tuple[Path, ...] = tuple(drop)
        self._drop_kept_bytes = tuple(p for p in self.drop if p != _MANAGED_FIELDS)
        self.secrets = redact_secrets

    def apply(self, obj: Mapping[str, Any] | None, resource: ResourceRef) -> Mapping[str, Any] | None:
        if obj is None:
            return None
        out: Any = obj
        secret = self.secrets and resource.group == "" and resource.resource == "secrets"
        drop = self.drop
        if type(obj) is RawObject:
            # Kept as bytes, and forwarded as its bytes unless a redaction applies. Its managedFields
            # were cut when it was decoded (RawObject.managed_fields tells).
            if not obj.managed_fields:
                drop = self._drop_kept_bytes
            if not (secret or self.redact or drop):
                return obj
            out = obj.to_dict()  # shared: _apply copies whatever it changes
        if secret:
            for path in _SECRET_PATHS:
                out = _apply(out, path, drop=False)
        for path in self.redact:
            out = _apply(out, path, drop=False)
        for path in drop:
            out = _apply(out, path, drop=True)
        result: Mapping[str, Any] = out
        return result
