"""Strategic merge patch (``application/strategic-merge-patch+json``), as kube-apiserver applies it.

A JSON merge patch replaces lists whole; a strategic merge patch merges lists of objects by their merge
key (``containers`` by ``name``) where the schema says ``x-kubernetes-patch-strategy: merge``, and
understands the directives kubectl writes:

* ``{"$patch": "replace"}`` in a map replaces it whole; in a list, the list becomes the patch's items;
* ``{"$patch": "delete"}`` in a map empties it; a list item ``{"name": "x", "$patch": "delete"}``
  removes the item with that merge key;
* ``"$setElementOrder/<list>": [...]`` gives the final order of a merged list (items the patch does
  not mention keep their place relative to the others, as the server decides it);
* ``"$retainKeys": [...]`` drops the map's fields not named (``x-kubernetes-patch-strategy:
  retainKeys``, e.g. a Deployment's ``strategy`` or a Volume's source);
* ``"$deleteFromPrimitiveList/<list>": [...]`` removes those values from a list of scalars merged as a
  set (``finalizers``);
* ``null`` removes a field.

Fields without a schema (unknown to the simulator) merge maps and replace lists, as JSON merge patch
does. The original is never changed: new containers are built along the patched paths only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from bridge.sim.openapi import PatchMeta, Schema, Schemas
from bridge.sim.status import BadRequest

__all__ = ["strategic_merge_patch"]

_PATCH = "$patch"
_RETAIN_KEYS = "$retainKeys"
_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


def _copy(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def strategic_merge_patch(original: Mapping[str, Any], patch: Mapping[str, Any], schemas: Schemas,
                          schema: Schema | None) -> dict[str, Any]:
    """``patch`` applied to ``original`` (an object of the kind whose schema is ``schema``)."""
    if not isinstance(patch, Mapping):
        raise BadRequest("a strategic merge patch must be a JSON object")
    return _Merger(schemas).merge_map(dict(original), dict(patch), schema)


class _Merger:
    def __init__(self, schemas: Schemas) -> None:
        self.schemas = schemas

    def merge_map(self, original: dict[str, Any], patch: dict[str, Any],
                  schema: Schema | None) -> dict[str, Any]:
        directive = patch.get(_PATCH)
        if directive is not None:
            if directive == "replace":
                return self.merge_map({}, {k: v for k, v in patch.items() if k != _PATCH}, schema)
            if directive == "delete":
                return {}
            raise BadRequest(f"unknown patch type: {directive!r} in map: {patch!r}")
        result = dict(original)
        patch = dict(patch)
        retain = patch.pop(_RETAIN_KEYS, None)
        if retain is not None:
            if not isinstance(retain, list):
                raise BadRequest(f"invalid {_RETAIN_KEYS} value: {retain!r}, expected a list")
            keep = set(retain)
            for key in list(result):
                if key not in keep:
                    del result[key]
        # Lists with an order directive are merged together with it (and then taken out of the patch).
        for key in [k for k in patch if k.startswith(_ORDER)]:
            name = key[len(_ORDER):]
            order = patch.pop(key)
            if not isinstance(order, list):
                raise BadRequest(f"invalid {key} value: {order!r}, expected a list")
            sub, meta = self.schemas.field(schema, name)
            has_patch = name in patch
            patch_list = patch.pop(name, None)
            if has_patch and patch_list is None:
                result.pop(name, None)
                continue
            if patch_list is not None and not isinstance(patch_list, list):
                result[name] = self.strip(patch_list, sub)
                continue
            original_list = result.get(name)
            original_list = original_list if isinstance(original_list, list) else []
            merged = self.merge_list(original_list, patch_list or [], sub, meta)
            result[name] = _order(merged, order, original_list, meta.merge_key)
        deletes = [k for k in patch if k.startswith(_DELETE_FROM)]
        for key, value in patch.items():
            if key.startswith(_DELETE_FROM):
                continue
            if value is None:
                result.pop(key, None)
                continue
            sub, meta = self.schemas.field(schema, key)
            current = result.get(key)
            if isinstance(current, dict) and isinstance(value, dict):
                if "replace" in meta.strategies:
                    result[key] = self.strip(value, sub)
                else:
                    result[key] = self.merge_map(current, value, sub)
            elif isinstance(current, list) and isinstance(value, list):
                result[key] = self.merge_list(current, value, sub, meta)
            else:
                result[key] = self.strip(value, sub)
        for key in deletes:
            name = key[len(_DELETE_FROM):]
            values = patch[key]
            if not isinstance(values, list):
                raise BadRequest(f"invalid {key} value: {values!r}, expected a list")
            current = result.get(name)
            if isinstance(current, list):
                result[name] = [v for v in current if v not in values]
        return result

    def merge_list(self, original: list[Any], patch: list[Any], schema: Schema | None,
                   meta: PatchMeta) -> list[Any]:
        items = self.schemas.items(schema) if schema is not None else None
        if "merge" not in meta.strategies:
            return [self.strip(v, items) for v in patch]
        if not patch:
            return list(original)
        if not any(isinstance(v, dict) for v in patch):
            merged = list(original)
            for value in patch:
                if value not in merged:
                    merged.append(value)
            return merged
        key = meta.merge_key
        result = list(original)
        plain: list[dict[str, Any]] = []
        for value in patch:
            if not isinstance(value, dict):
                raise BadRequest(f"a list merged by {key!r} cannot hold {value!r}")
            directive = value.get(_PATCH)
            if directive is None:
                plain.append(value)
            elif directive == "delete":
                if key not in value:
                    raise BadRequest(f"map: {value!r} does not contain declared merge key: {key}")
                result = [o for o in result if not (isinstance(o, dict) and o.get(key) == value[key])]
            elif directive == "replace":
                return [self.strip(v, items) for v in patch if not (isinstance(v, dict) and _PATCH in v)]
            else:
                raise BadRequest(f"unknown patch type: {directive!r} in list item: {value!r}")
        for value in plain:
            if key not in value:
                raise BadRequest(f"map: {value!r} does not contain declared merge key: {key}")
            for i, existing in enumerate(result):
                if isinstance(existing, dict) and existing.get(key) == value[key]:
                    result[i] = self.merge_map(existing, value, items)
                    break
            else:
                result.append(self.merge_map({}, value, items))
        return result

    def strip(self, value: Any, schema: Schema | None) -> Any:
        """A new value from a patch: its directives applied to nothing (so none is stored)."""
        if isinstance(value, dict):
            return self.merge_map({}, value, schema)
        if isinstance(value, list):
            items = self.schemas.items(schema) if schema is not None else None
            return [self.strip(v, items) for v in value if not (isinstance(v, dict) and _PATCH in v)]
        return _copy(value) if isinstance(value, (dict, list)) else value


def _identity(value: Any, merge_key: str) -> Any:
    if merge_key and isinstance(value, dict):
        return ("k", orjson.dumps(value.get(merge_key)))
    return ("v", orjson.dumps(value))


def _order(merged: list[Any], order: list[Any], original: list[Any], merge_key: str) -> list[Any]:
    """``merged`` in the order ``$setElementOrder`` gives; items it does not name (the server's own)
    keep their place relative to the named ones, by their position in ``original``."""
    wanted = [_identity(v, merge_key) for v in order]
    rank = {ident: i for i, ident in enumerate(wanted)}
    server_rank = {_identity(v, merge_key): i for i, v in enumerate(original)}
    named = sorted((v for v in merged if _identity(v, merge_key) in rank),
                   key=lambda v: rank[_identity(v, merge_key)])
    others = sorted((v for v in merged if _identity(v, merge_key) not in rank),
                    key=lambda v: server_rank.get(_identity(v, merge_key), len(server_rank)))
    out: list[Any] = []
    i = j = 0
    while i < len(named) or j < len(others):
        if j >= len(others):
            out.append(named[i])
            i += 1
        elif i >= len(named):
            out.append(others[j])
            j += 1
        else:
            left = server_rank.get(_identity(named[i], merge_key))
            right = server_rank.get(_identity(others[j], merge_key))
            if left is not None and right is not None and left < right:
                out.append(named[i])
                i += 1
            else:
                out.append(others[j])
                j += 1
    return out
