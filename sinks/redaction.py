"""Redaction: keep secrets and bulk out of what leaves the cluster.

By default a Secret's ``data`` and ``stringData`` values are replaced by :data:`REDACTED` (the keys
stay, so consumers still see which keys changed) wherever they appear in the object: the
``kubectl.kubernetes.io/last-applied-configuration`` annotation (which ``kubectl apply`` fills with
the whole applied Secret) is parsed and its ``data`` / ``stringData`` redacted the same way, and
whole when it cannot be parsed; any other annotation or label whose value contains one of the
Secret's values (as written in ``data``, base64-decoded, or from ``stringData``) is replaced whole.
``metadata.managedFields`` is dropped (it is
~20% of a typical object and no consumer wants it). Users add paths to redact (value replaced; for a
mapping every value replaced, keys kept; for a list every item replaced) or to drop (key removed).

Objects are shared by every sink and must not be mutated, so redaction copies on write: only the
mappings along a redacted path are copied, the rest of the tree is shared with the original.

:meth:`Redactor.spill_form` is what a sink's spill keeps of an object (a stuck sink's backlog on
disk): the same redactions, but each redacted value replaced by a mark keyed per process
(``<redacted:…>``, an HMAC of the value under a random key never written anywhere), so that two
states of an object still differ where their secrets differ (the change filter and merge patches
compare them after the spill) while nothing on disk can be matched against a guessed value.
Dropped paths stay (they are bulk, not secrets, and the change filter may compare them); the sink's
:meth:`Redactor.apply` at encoding turns every mark into :data:`REDACTED`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
import orjson

from bridge.jsonbounds import MAX_DEPTH, exceeds_depth
from bridge.rawobject import RawObject, dumps
from sinks.contract import ResourceRef
from sinks.filters import WILDCARD, Path, is_mapping, parse_path

__all__ = ["LAST_APPLIED", "REDACTED", "Redactor", "secret_values"]

REDACTED = "<redacted>"

_SECRET_PATHS: tuple[Path, ...] = (("data",), ("stringData",))
_MANAGED_FIELDS: Path = ("metadata", "managedFields")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def secret_values(obj: Mapping[str, Any]) -> frozenset[str]:
    """Every non-empty value a Secret holds, as text: each ``data`` value as written (base64) and
    decoded (when it is UTF-8), each ``stringData`` value."""
    values: set[str] = set()
    data = obj.get("data")
    if isinstance(data, Mapping):
        for value in data.values():
            text = value if isinstance(value, str) else dumps(value).decode()
            values.add(text)
            with contextlib.suppress(binascii.Error, ValueError):
                values.add(base64.b64decode(text, validate=True).decode("utf-8"))
    string_data = obj.get("stringData")
    if isinstance(string_data, Mapping):
        for value in string_data.values():
            values.add(value if isinstance(value, str) else dumps(value).decode())
    values.discard("")
    return frozenset(values)


Mark = Callable[[Any], str]
"""What a redacted value becomes: :data:`REDACTED`, or a spill's keyed mark of the value."""


def _plain(_value: Any) -> str:
    return REDACTED


def keyed_mark(key: bytes) -> Mark:
    """A mark ``<redacted:…>`` of a value: the first 96 bits of its HMAC-SHA256 under ``key`` (of its
    JSON, an integer beyond 64 bits written exactly)."""
    def mark(value: Any) -> str:
        digest = hmac.new(key, dumps(value), hashlib.sha256).hexdigest()[:24]
        return f"<redacted:{digest}>"
    return mark


def _holds_any(text: str, values: frozenset[str]) -> bool:
    return any(value in text for value in values)


def _redact_applied(text: str, values: frozenset[str], mark: Mark) -> str:
    """The last-applied annotation of a Secret, its values redacted; :data:`REDACTED` when it is not
    a JSON object, nests deeper than the decoders' bound or still holds a value after redaction.

    The annotation is a string inside the object, so the decoders' bounds did not look into it: its
    depth is checked here (below orjson's re-encoding limit), and it is decoded with msgspec, which
    keeps an integer beyond 64 bits exact (orjson would round it to a float), and written again by
    :func:`bridge.rawobject.dumps`, which writes such an integer as it came."""
    data = text.encode("utf-8", "surrogatepass")
    if exceeds_depth(data, MAX_DEPTH):
        return REDACTED
    try:
        applied = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return REDACTED
    if not is_mapping(applied):
        return REDACTED
    values = values | secret_values(applied)
    for path in _SECRET_PATHS:
        applied = _apply(applied, path, drop=False, mark=mark)
    applied = _redact_metadata(applied, values, mark)
    out = dumps(applied).decode()
    # Escaped forms too: a value with a quote or a control character is written escaped.
    escaped = frozenset(orjson.dumps(v).decode()[1:-1] for v in values)
    return REDACTED if _holds_any(out, values | escaped) else out


def _redact_metadata(obj: Mapping[str, Any], values: frozenset[str], mark: Mark) -> Mapping[str, Any]:
    """``obj`` with the Secret's values removed from its annotations and labels (copied on write)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return obj
    new_meta: dict[str, Any] | None = None
    for field in ("annotations", "labels"):
        entries = meta.get(field)
        if not isinstance(entries, Mapping):
            continue
        changed: dict[str, Any] | None = None
        for key, value in entries.items():
            text = value if isinstance(value, str) else str(value)
            if field == "annotations" and key == LAST_APPLIED:
                redacted = _redact_applied(text, values, mark)
            elif _holds_any(text, values):
                redacted = REDACTED
            else:
                continue
            if redacted != value:
                if changed is None:
                    changed = dict(entries)
                changed[key] = redacted
        if changed is not None:
            if new_meta is None:
                new_meta = dict(meta)
            new_meta[field] = changed
    if new_meta is None:
        return obj
    out = dict(obj)
    out["metadata"] = new_meta
    return out


def _redact_value(value: Any, mark: Mark = _plain) -> Any:
    if is_mapping(value):
        return {k: mark(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mark(v) for v in value]
    return mark(value)


def _apply(node: Any, path: Path, drop: bool, mark: Mark = _plain) -> Any:
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
                out[key] = _apply(node[key], rest, drop, mark)
            elif drop:
                del out[key]
            else:
                out[key] = _redact_value(node[key], mark)
        return out
    if isinstance(node, list) and head == WILDCARD:
        if rest:
            return [_apply(item, rest, drop, mark) for item in node]
        return [] if drop else [_redact_value(item, mark) for item in node]
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

    def leaves_raw(self, resource: ResourceRef) -> bool:
        """True when :meth:`apply` returns a RawObject of ``resource`` without managedFields as it
        is (nothing to redact or drop in it)."""
        secret = self.secrets and resource.group == "" and resource.resource == "secrets"
        return not (secret or self.redact or self._drop_kept_bytes)

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
            values = secret_values(out)
            for path in _SECRET_PATHS:
                out = _apply(out, path, drop=False)
            out = _redact_metadata(out, values, _plain)
        for path in self.redact:
            out = _apply(out, path, drop=False)
        for path in drop:
            out = _apply(out, path, drop=True)
        result: Mapping[str, Any] = out
        return result

    def redacts(self, resource: ResourceRef) -> bool:
        """True when :meth:`apply` replaces values of ``resource``'s objects (a Secret's, or paths)."""
        return bool(self.redact) or (self.secrets and resource.group == "" and resource.resource == "secrets")

    def spill_form(self, obj: Mapping[str, Any], resource: ResourceRef, mark: Mark) -> Mapping[str, Any]:
        """What a spill keeps of ``obj`` (module docs): its redacted values replaced by ``mark``
        of each, annotations and labels holding a Secret's value by :data:`REDACTED`; ``obj``
        itself when nothing of it is redacted."""
        if not self.redacts(resource):
            return obj
        out: Any = obj.to_dict() if type(obj) is RawObject else obj
        if self.secrets and resource.group == "" and resource.resource == "secrets":
            values = secret_values(out)
            for path in _SECRET_PATHS:
                out = _apply(out, path, drop=False, mark=mark)
            out = _redact_metadata(out, values, mark)
        for path in self.redact:
            out = _apply(out, path, drop=False, mark=mark)
        result: Mapping[str, Any] = out
        return result
