"""Field ownership: ``metadata.managedFields`` and server-side apply, for the common cases.

kube-apiserver records, per manager (``fieldManager``, or the client's user agent) and operation
(``Apply`` or ``Update``), the set of fields that manager last set, as a ``FieldsV1`` tree
(``f:<field>``, ``k:{<list-map keys>}`` for list items, ``v:<value>`` for set members, ``.`` for the
node itself). Server-side apply (``application/apply-patch+yaml``) then:

* merges the applied configuration into the live object (maps by field, list-maps by their keys,
  sets by value, anything atomic replaced);
* removes the fields the manager applied before and no longer applies, unless someone else owns them;
* refuses (409 Conflict) to change a field another manager owns to a different value unless
  ``force=true``, which moves the field to the applier.

An update (create, PUT, any other patch) gives its manager the fields it changed and takes them from
the others. Lists are typed by the schema's ``x-kubernetes-list-type`` / ``-list-map-keys`` (or, for
older definitions, the patch merge key); fields without a schema are atomic below their own level.
What is left out: ownership of the ``.`` of maps created by updates, and the version conversion of
managed fields (every kind is served at one version).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from bridge.sim.openapi import Schema, Schemas
from bridge.sim.status import Conflict

__all__ = ["FieldOwner", "apply_config", "record_update"]

Path = tuple[str, ...]
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_CLIENT_SIDE_APPLY = "kubectl-client-side-apply"
_META_SKIP = frozenset({"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                        "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"})


@dataclass(frozen=True, slots=True)
class FieldOwner:
    """Who writes: the manager, and which request it is."""

    manager: str
    api_version: str
    subresource: str | None = None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _atomic_map(node: Schema | None, prop: Schema | None) -> bool:
    return any((n or {}).get("x-kubernetes-map-type") == "atomic" for n in (node, prop))


class _Fields:
    """Field sets of objects of one kind."""

    def __init__(self, schemas: Schemas, schema: Schema | None, *, with_status: bool) -> None:
        self.schemas = schemas
        self.schema = schema
        self.with_status = with_status

    def of(self, obj: Mapping[str, Any]) -> set[Path]:
        out: set[Path] = set()
        for key, value in obj.items():
            if key in ("apiVersion", "kind") or (key == "status" and not self.with_status):
                continue
            if key == "metadata" and isinstance(value, Mapping):
                meta = {k: v for k, v in value.items() if k not in _META_SKIP}
                if meta:  # name, namespace and the server's fields are nobody's
                    sub, _ = self.schemas.field(self.schema, "metadata")
                    self._walk(meta, sub, None, ("f:metadata",), out)
                continue
            sub, _ = self.schemas.field(self.schema, key)
            prop = self._prop(self.schema, key)
            self._value(value, sub, prop, ("f:" + key,), out)
        return out

    def _prop(self, node: Schema | None, key: str) -> Schema | None:
        return self.schemas.declared(node, key)

    def _walk(self, obj: Mapping[str, Any], node: Schema | None, prop: Schema | None, path: Path,
              out: set[Path]) -> None:
        if not obj:
            out.add(path)
            return
        for key, value in obj.items():
            sub, _ = self.schemas.field(node, key)
            self._value(value, sub, self._prop(node, key), (*path, "f:" + key), out)

    def _value(self, value: Any, node: Schema | None, prop: Schema | None, path: Path,
               out: set[Path]) -> None:
        if _is_map(value) and node is not None and not _atomic_map(node, prop):
            self._walk(value, node, prop, path, out)
        elif isinstance(value, list) and value and node is not None:
            meta = self.schemas.patch_meta(prop)
            items = self.schemas.items(node)
            if meta.list_type == "map" and meta.list_keys:
                for item in value:
                    if not _is_map(item):
                        out.add(path)
                        return
                    ip = (*path, _item_key(item, meta.list_keys))
                    out.add(ip)
                    self._walk(item, items, None, ip, out)
            elif meta.list_type == "set":
                for item in value:
                    out.add((*path, "v:" + _dumps(item)))
            else:
                out.add(path)
        else:
            out.add(path)


def _item_key(item: Mapping[str, Any], keys: Iterable[str]) -> str:
    return "k:" + _dumps({k: item.get(k) for k in keys if k in item})


# ---------------------------------------------------------------------- paths in objects


def _is_map(value: Any) -> bool:
    """``isinstance(value, Mapping)``, without the ABC check for the JSON dicts objects are made of."""
    return type(value) is dict or isinstance(value, Mapping)


def _step(value: Any, element: str) -> Any:
    kind, _, rest = element.partition(":")
    if kind == "f":
        return value.get(rest) if _is_map(value) else None
    if not isinstance(value, list):
        return None
    if kind == "k":
        want = orjson.loads(rest)
        for item in value:
            if isinstance(item, Mapping) and all(item.get(k) == v for k, v in want.items()):
                return item
        return None
    target = orjson.loads(rest)
    return target if target in value else None


_MISSING = object()


def value_at(obj: Any, path: Path) -> Any:
    cur = obj
    for element in path:
        cur = _step(cur, element)
        if cur is None:
            return _MISSING
    return cur


class _Lookup:
    """:func:`value_at` for many paths of one object: each prefix is stepped into once (the paths of
    an object's fields share most of their prefixes)."""

    __slots__ = ("_at",)

    def __init__(self, obj: Any) -> None:
        self._at: dict[Path, Any] = {(): obj}

    def __call__(self, path: Path) -> Any:
        found = self._at.get(path, _UNSEEN)
        if found is _UNSEEN:
            parent = self(path[:-1])
            found = _MISSING if parent is _MISSING else _step(parent, path[-1])
            if found is None:
                found = _MISSING
            self._at[path] = found
        return found


_UNSEEN = object()


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Removes the field at ``path`` from ``obj`` (a tree of fresh containers along the path)."""
    parent: Any = obj
    for element in path[:-1]:
        parent = _step(parent, element)
        if parent is None:
            return
    last = path[-1]
    kind, _, rest = last.partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind in ("k", "v") and isinstance(parent, list):
        target = _step(parent, last)
        if target is not None:
            parent.remove(target)


def _leaves(paths: set[Path]) -> set[Path]:
    prefixes = {p[:i] for p in paths for i in range(1, len(p))}
    return paths - prefixes


def _render(path: Path) -> str:
    out = ""
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            out += "." + rest
        elif kind == "k":
            keys = orjson.loads(rest)
            out += "[" + ",".join(f"{k}={_dumps(v)}" for k, v in keys.items()) + "]"
        else:
            out += f"[={rest}]"
    return out


# ---------------------------------------------------------------------- FieldsV1 trees


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    members: list[Path] = list(paths)
    for path in members:
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in members:
        node = tree
        for element in path:
            node = node[element]
        if node:
            node["."] = {}
    return tree


def from_fields_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(tree, Mapping):
        return out
    for key, value in tree.items():
        if key == ".":
            if prefix:
                out.add(prefix)
            continue
        path = (*prefix, str(key))
        if not value:
            out.add(path)
        else:
            out |= from_fields_v1(value, path)
    return out


# ---------------------------------------------------------------------- entries


def _entries(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = (obj.get("metadata") or {}).get("managedFields") or []
    return [dict(e) for e in raw if isinstance(e, Mapping)]


def _entry_id(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(entry.get("manager", "")), str(entry.get("operation", "")), str(entry.get("subresource", "")))


def _entry(owner: FieldOwner, operation: str, paths: set[Path]) -> dict[str, Any]:
    entry: dict[str, Any] = {"manager": owner.manager, "operation": operation,
                             "apiVersion": owner.api_version, "time": _now(), "fieldsType": "FieldsV1",
                             "fieldsV1": to_fields_v1(sorted(paths))}
    if owner.subresource:
        entry["subresource"] = owner.subresource
    return entry


def _store(result: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    meta = dict(result.get("metadata") or {})
    kept = [e for e in entries if e.get("fieldsV1")]
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)
    result["metadata"] = meta


def record_update(schemas: Schemas, schema: Schema | None, old: Mapping[str, Any] | None,
                  new: dict[str, Any], owner: FieldOwner, *, with_status: bool) -> None:
    """Gives ``owner`` (operation Update) the fields ``new`` changed from ``old`` (None: created),
    takes them from the other managers, and writes ``new``'s managedFields."""
    fields = _Fields(schemas, schema, with_status=with_status or owner.subresource == "status")
    new_set = fields.of(new)
    old_set = fields.of(old) if old is not None else set()
    if old is None:
        changed = new_set
    else:
        leaves = _leaves(new_set)
        new_at, old_at = _Lookup(new), _Lookup(old)
        changed = {p for p in new_set - old_set} | {
            p for p in leaves & old_set if new_at(p) != old_at(p)}
    removed = old_set - new_set
    entries = _entries(new) if old is None else _entries(old)
    new_managed = (new.get("metadata") or {}).get("managedFields")
    if old is not None and new_managed != (old.get("metadata") or {}).get("managedFields"):
        entries = _entries(new)  # the writer replaced the managed fields itself
    me = (owner.manager, "Update", owner.subresource or "")
    mine: set[Path] = set()
    out: list[dict[str, Any]] = []
    for entry in entries:
        owned = from_fields_v1(entry.get("fieldsV1")) - removed
        if _entry_id(entry) == me:
            mine = owned
            continue
        owned -= changed
        if owned:
            out.append({**entry, "fieldsV1": to_fields_v1(sorted(owned))})
    mine = (mine | changed) & new_set
    if mine:
        out.append(_entry(owner, "Update", mine))
    _store(new, out)


def _merge(live: Any, config: Any, schemas: Schemas, node: Schema | None, prop: Schema | None) -> Any:
    if isinstance(live, dict) and isinstance(config, Mapping) and not _atomic_map(node, prop):
        result = dict(live)
        for key, value in config.items():
            sub, _ = schemas.field(node, key)
            resolved = schemas.resolve(node)
            props = (resolved or {}).get("properties") or {}
            sub_prop = props.get(key) if isinstance(props, Mapping) else None
            if sub_prop is None and isinstance((resolved or {}).get("additionalProperties"), Mapping):
                sub_prop = resolved["additionalProperties"] if resolved else None
            result[key] = _merge(result.get(key), value, schemas, sub, sub_prop) if key in result else \
                orjson.loads(orjson.dumps(value))
        return result
    if isinstance(live, list) and isinstance(config, list):
        meta = schemas.patch_meta(prop)
        items = schemas.items(node)
        if meta.list_type == "map" and meta.list_keys:
            result_list = list(live)
            for item in config:
                ident = {k: item.get(k) for k in meta.list_keys} if isinstance(item, Mapping) else None
                for i, existing in enumerate(result_list):
                    if ident is not None and isinstance(existing, Mapping) and all(
                            existing.get(k) == v for k, v in ident.items()):
                        result_list[i] = _merge(dict(existing), item, schemas, items, None)
                        break
                else:
                    result_list.append(orjson.loads(orjson.dumps(item)))
            return result_list
        if meta.list_type == "set":
            return list(live) + [v for v in config if v not in live]
    return orjson.loads(orjson.dumps(config))


def apply_config(schemas: Schemas, schema: Schema | None, live: Mapping[str, Any] | None,
                 config: Mapping[str, Any], owner: FieldOwner, *, force: bool,
                 with_status: bool) -> dict[str, Any]:
    """The object after ``owner`` applies ``config`` to ``live`` (None: the object is created);
    raises 409 Conflict naming the other managers' fields it would change, unless ``force``."""
    fields = _Fields(schemas, schema, with_status=with_status)
    applied = fields.of(config)
    base: dict[str, Any] = orjson.loads(orjson.dumps(live)) if live is not None else {}
    entries = _entries(base)
    me = (owner.manager, "Apply", owner.subresource or "")
    previous: set[Path] = set()
    others: list[tuple[dict[str, Any], set[Path]]] = []
    for entry in entries:
        owned = from_fields_v1(entry.get("fieldsV1"))
        if _entry_id(entry) == me:
            previous = owned
        else:
            others.append((entry, owned))
    conflicts: dict[str, list[Path]] = {}
    leaves = _leaves(applied)
    # Moving from client-side to server-side apply is free of conflicts: the fields kubectl's
    # client-side record says it applied are taken over (kube-apiserver's last-applied manager).
    upgraded = _last_applied_fields(fields, base)
    for entry, owned in others:
        if entry.get("manager") == _CLIENT_SIDE_APPLY:
            owned.difference_update(leaves & upgraded)  # taken over, not conflicting
        clash = sorted(p for p in leaves & owned if value_at(config, p) != value_at(base, p))
        if clash:
            label = f'"{entry.get("manager", "")}"'
            if entry.get("operation") == "Update" and entry.get("subresource"):
                label += f' with subresource "{entry["subresource"]}"'
            conflicts.setdefault(f'{label} using {entry.get("apiVersion", owner.api_version)}', []).extend(
                clash)
    if conflicts and not force:
        raise _conflict(conflicts)
    stolen = {p for paths in conflicts.values() for p in paths}
    owned_by_others = set().union(*(owned for _, owned in others)) if others else set()
    gone = previous - applied - owned_by_others
    for path in sorted(gone, key=len):
        if not any(path[:i] in gone for i in range(1, len(path))):  # its parent goes whole
            _remove(base, path)
    merged = _merge(base, dict(config), schemas, schema, None)
    assert isinstance(merged, dict)
    out: list[dict[str, Any]] = []
    for entry, owned in others:
        kept = owned - stolen
        if kept:
            out.append({**entry, "fieldsV1": to_fields_v1(sorted(kept))})
    out.append(_entry(owner, "Apply", applied))
    _store(merged, out)
    return merged


def _last_applied_fields(fields: _Fields, live: Mapping[str, Any]) -> set[Path]:
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(_LAST_APPLIED)
    if not isinstance(raw, str):
        return set()
    try:
        applied = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return set()
    return fields.of(applied) if isinstance(applied, Mapping) else set()


def _conflict(conflicts: Mapping[str, list[Path]]) -> Conflict:
    count = sum(len(p) for p in conflicts.values())
    causes: list[dict[str, str]] = []
    parts: list[str] = []
    for who, paths in conflicts.items():
        for path in paths:
            causes.append({"reason": "FieldManagerConflict", "message": f"conflict with {who}",
                           "field": _render(path)})
        if len(paths) == 1:
            parts.append(f"conflict with {who}: {_render(paths[0])}")
        else:
            parts.append(f"conflicts with {who}:\n" + "\n".join(f"- {_render(p)}" for p in paths))
    plural = "conflict" if count == 1 else "conflicts"
    message = f"Apply failed with {count} {plural}: " + "\n".join(parts)
    return Conflict(message, details={"causes": causes})
