"""What goes in an event's ``data``: the new object, new and old objects, or a JSON merge patch.

``object`` (default): the object (for deletes, its last known state; markers carry no object).
``object_and_old``: ``{"object": new, "oldObject": old}``; ``oldObject`` is null except for updates.
``merge_patch``: for updates, the RFC 7386 merge patch that turns the old object into the new one
(``null`` for removed keys, nested mappings patched recursively, lists replaced whole), with content
type ``application/merge-patch+json``; every other event type carries the object as in ``object``.

A merge patch cannot express a ``null`` *value* inside the new object (null means "remove"); such
values are rare in Kubernetes objects and are reported as removals.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from bridge.rawobject import plain
from sinks.contract import EventType
from sinks.filters import is_mapping

__all__ = ["MERGE_PATCH_CONTENT_TYPE", "PayloadMode", "apply_merge_patch", "build_payload", "merge_patch"]

MERGE_PATCH_CONTENT_TYPE = "application/merge-patch+json"
JSON_CONTENT_TYPE = "application/json"


class PayloadMode(enum.StrEnum):
    OBJECT = "object"
    OBJECT_AND_OLD = "object_and_old"
    MERGE_PATCH = "merge_patch"


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch turning ``old`` into ``new``."""
    if not is_mapping(new):
        return new
    if not is_mapping(old):
        old = {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
            continue
        before = old[key]
        if before is value or before == value:
            continue
        if is_mapping(value) and is_mapping(before):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 ``MergePatch(target, patch)``; returns a new value, never mutating ``target``."""
    if not is_mapping(patch):
        return patch
    result: dict[str, Any] = dict(target) if is_mapping(target) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def build_payload(
    mode: PayloadMode,
    event_type: EventType,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
) -> tuple[Any, str]:
    """Returns ``(data, datacontenttype)`` for one event."""
    if mode is PayloadMode.OBJECT:
        return obj, JSON_CONTENT_TYPE
    if mode is PayloadMode.OBJECT_AND_OLD:
        previous = old if event_type is EventType.UPDATED else None
        return {"object": obj, "oldObject": previous}, JSON_CONTENT_TYPE
    if event_type is EventType.UPDATED and obj is not None:
        return merge_patch(plain(old) if old is not None else None, plain(obj)), MERGE_PATCH_CONTENT_TYPE
    return obj, JSON_CONTENT_TYPE
