"""The simulator's object store: etcd plus kube-apiserver's watch cache, in memory.

It keeps what the bridge's reflector depends on, exactly: ONE global, monotonically increasing
resourceVersion (integers rendered as strings); objects keyed by resource and ``namespace/name``; a
bounded per-resource event history (the watch cache) from which watches resume and consistent list
snapshots at an older resourceVersion are rebuilt; compaction, after which such requests get 410
Expired; and watchers fed synchronously from every change, each with a bounded buffer that closes the
watch when its reader falls too far behind (kube-apiserver drops slow watchers the same way).

Everything here is synchronous and runs on the event loop's thread, so a change, its history entry and
its delivery to every watcher happen atomically; only :meth:`ObjectStore.wait_for_rv` and
:meth:`Watcher.get` wait. Stored objects are never mutated after they are committed, so history entries,
snapshots and watchers share them; the public read methods hand out copies.
"""

from __future__ import annotations

import asyncio
import secrets
import string
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from bridge.clock import Clock, RealClock
from bridge.kube.labels import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector
from bridge.sim.managed import FieldOwner, apply_config, record_update
from bridge.sim.openapi import Schemas
from bridge.sim.resources import ResourceRegistry, ResourceType
from bridge.sim.status import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Expired,
    Invalid,
    NotFound,
    UnsupportedMediaType,
)
from bridge.sim.strategic import strategic_merge_patch

KubeObject = dict[str, Any]
"""The simulator's objects: JSON dicts it owns and changes (the bridge's objects are read-only)."""

__all__ = [
    "DEFAULT_HISTORY_SIZE",
    "DEFAULT_WATCHER_BUFFER",
    "Change",
    "ObjectStore",
    "PatchType",
    "WatchFilter",
    "Watcher",
    "apply_json_patch",
    "json_merge_patch",
]

_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
DEFAULT_HISTORY_SIZE = 10_000
DEFAULT_WATCHER_BUFFER = 10_000

_Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""


def _copy(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj))


def _newer_than(history: deque[Change], rv: int) -> list[Change]:
    """The changes of ``history`` (in resourceVersion order) after ``rv``, found from its newest end:
    a watch resumed near the head does not walk a long history (a simulator serving many test runs
    holds hundreds of thousands of changes, and a client whose watch is cut every few lines
    resumes many times a second)."""
    newer: list[Change] = []
    for change in reversed(history):
        if change.rv <= rv:
            break
        newer.append(change)
    newer.reverse()
    return newer


def _copy_obj(obj: Mapping[str, Any]) -> KubeObject:
    out: KubeObject = orjson.loads(orjson.dumps(obj))
    return out


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass(slots=True)
class Change:
    """One committed change, as the watch cache keeps it.

    ``prev`` is the state before the change (None for ADDED); it lets the store rebuild older snapshots
    and lets selector-filtered watchers turn updates into ADDED/DELETED as the object enters or leaves
    their selection.
    """

    rv: int
    type: str
    obj: KubeObject
    prev: KubeObject | None = None
    _encoded: bytes | None = field(default=None, repr=False)

    def encoded_object(self) -> bytes:
        """The object's JSON, encoded once and shared by every watcher."""
        if self._encoded is None:
            self._encoded = orjson.dumps(self.obj)
        return self._encoded


@dataclass(frozen=True, slots=True)
class WatchFilter:
    """The scope of one list or watch: namespace and selectors."""

    namespace: str | None = None
    labels: LabelSelector = field(default_factory=LabelSelector)
    fields: FieldSelector = field(default_factory=FieldSelector)

    @classmethod
    def parse(cls, *, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None) -> WatchFilter:
        """Raises ``bridge.labels.SelectorError`` on a malformed selector."""
        return cls(namespace=namespace or None, labels=parse_label_selector(label_selector),
                   fields=parse_field_selector(field_selector))

    @property
    def has_selectors(self) -> bool:
        return not (self.labels.empty and self.fields.empty)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        return self.labels.matches_object(obj) and self.fields.matches_object(obj)


class Watcher:
    """One open watch: a bounded buffer of changes the store pushes and the server drains.

    The store calls :meth:`offer` synchronously on every change of the resource; when the buffer is
    full the watcher is closed (the client re-watches from the last resourceVersion it saw). ``initial``
    holds the synthetic ADDED changes of a watch started without a resourceVersion or with
    ``sendInitialEvents``; ``start_rv`` is the store's resourceVersion when the watch was registered.
    """

    def __init__(self, *, store: ObjectStore, resource: ResourceType, scope: WatchFilter, start_rv: int,
                 initial: list[Change], backlog: Iterable[Change], max_buffer: int) -> None:
        self.resource = resource
        self.scope = scope
        self.start_rv = start_rv
        self.initial = initial
        self._store = store
        self._max_buffer = max_buffer
        self._buf: deque[Change] = deque()
        self._wake = asyncio.Event()
        self.closed_reason: str | None = None
        """None while open; why the watch ended otherwise ("stopped", "too slow", …)."""
        self.error: dict[str, Any] | None = None
        """A Status the server must send as an ERROR event before closing."""
        for change in backlog:
            translated = self._translate(change)
            if translated is not None:
                self._buf.append(translated)

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    @property
    def pending(self) -> int:
        return len(self._buf)

    def _translate(self, change: Change) -> Change | None:
        scope = self.scope
        if scope.namespace is None and not scope.has_selectors:
            return change
        now = scope.matches(change.obj)
        if change.type == "MODIFIED":
            before = change.prev is not None and scope.matches(change.prev)
            if before and now:
                return change
            if now:
                return Change(change.rv, "ADDED", change.obj, change.prev)
            if before and change.prev is not None:
                # The object left the selection: DELETED with its previous state at the new RV.
                gone = dict(change.prev)
                gone["metadata"] = {**change.prev.get("metadata", {}), "resourceVersion": str(change.rv)}
                return Change(change.rv, "DELETED", gone, change.prev)
            return None
        return change if now else None

    def offer(self, change: Change) -> None:
        """Called by the store for every change of this resource, in resourceVersion order."""
        if self.closed:
            return
        translated = self._translate(change)
        if translated is None:
            return
        if len(self._buf) >= self._max_buffer:
            self.close("too slow: buffer full")
            return
        self._buf.append(translated)
        self._wake.set()

    def close(self, reason: str = "closed", *, error: dict[str, Any] | None = None) -> None:
        """Ends the watch; pending changes are dropped. ``error`` is sent as a final ERROR event."""
        if self.closed:
            return
        self.closed_reason = reason
        self.error = error
        self._buf.clear()
        self._store._unregister(self)
        self._wake.set()

    async def get(self) -> Change | None:
        """The next change, or None once the watch is closed."""
        while True:
            if self._buf:
                return self._buf.popleft()
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()

    def take(self, max_items: int) -> list[Change]:
        """Up to ``max_items`` buffered changes, without waiting (empty when none are buffered)."""
        buf = self._buf
        count = min(max_items, len(buf))
        return [buf.popleft() for _ in range(count)]

    async def wait(self) -> None:
        """Returns once a change is buffered or the watch is closed."""
        while not self._buf and not self.closed:
            self._wake.clear()
            await self._wake.wait()


@dataclass(slots=True)
class _Bucket:
    resource: ResourceType
    objects: dict[_Key, KubeObject] = field(default_factory=dict)
    history: deque[Change] = field(default_factory=deque)
    compacted_rv: int = 0
    """Changes with rv <= compacted_rv are gone: older watches and snapshots get 410."""
    watchers: set[Watcher] = field(default_factory=set)


class PatchType:
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON = "application/json-patch+json"
    APPLY = "application/apply-patch+yaml"
    ALL = (MERGE, STRATEGIC, JSON, APPLY)


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return _copy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise BadRequest(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for part in parts:
        if isinstance(cur, list):
            try:
                cur = cur[int(part)]
            except (ValueError, IndexError) as exc:
                raise Invalid(f"JSON patch path element {part!r} is not a valid index") from exc
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise Invalid(f"JSON patch path element {part!r} does not exist")
    return cur


def apply_json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise BadRequest("a JSON patch must be a list of operations")
    doc = _copy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise BadRequest(f"invalid JSON patch operation {op!r}")
        kind = op["op"]
        parts = _pointer(str(op["path"]))
        if kind in ("move", "copy"):
            from_parts = _pointer(str(op.get("from", "")))
            value = _copy(_container(doc, from_parts))
            if kind == "move":
                doc = apply_json_patch(doc, [{"op": "remove", "path": op["from"]}])
            doc = apply_json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
            continue
        if kind == "test":
            if _container(doc, parts) != op.get("value"):
                raise Invalid(f"JSON patch test failed at {op['path']!r}")
            continue
        if not parts:
            if kind in ("add", "replace"):
                doc = _copy(op.get("value"))
                continue
            raise Invalid("cannot remove the whole document")
        parent = _container(doc, parts[:-1])
        last = parts[-1]
        if isinstance(parent, list):
            if kind == "add":
                idx = len(parent) if last == "-" else int(last)
                parent.insert(idx, _copy(op.get("value")))
            elif kind in ("remove", "replace"):
                idx = int(last)
                if not 0 <= idx < len(parent):
                    raise Invalid(f"JSON patch index {idx} out of range")
                if kind == "remove":
                    del parent[idx]
                else:
                    parent[idx] = _copy(op.get("value"))
            else:
                raise BadRequest(f"unknown JSON patch op {kind!r}")
        elif isinstance(parent, dict):
            if kind == "add":
                parent[last] = _copy(op.get("value"))
            elif kind in ("remove", "replace"):
                if last not in parent:
                    raise Invalid(f"JSON patch path {op['path']!r} does not exist")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = _copy(op.get("value"))
            else:
                raise BadRequest(f"unknown JSON patch op {kind!r}")
        else:
            raise Invalid(f"JSON patch path {op['path']!r} does not point into an object or array")
    return doc


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class ObjectStore:
    """Objects of every registered resource, with one global resourceVersion.

    The read methods (:meth:`get`, :meth:`list`) and the mutations return copies the caller may
    change freely. Names of resources are resolved by the registry (``pods``, ``deployments.apps``).
    """

    def __init__(
        self,
        *,
        registry: ResourceRegistry | None = None,
        history_size: int = DEFAULT_HISTORY_SIZE,
        watcher_buffer: int = DEFAULT_WATCHER_BUFFER,
        clock: Clock | None = None,
        initial_namespaces: Iterable[str] = ("default", "kube-system"),
    ) -> None:
        if history_size < 1:
            raise ValueError("history_size must be at least 1")
        if watcher_buffer < 1:
            raise ValueError("watcher_buffer must be at least 1")
        self.registry = registry or ResourceRegistry.with_builtins()
        self.schemas = Schemas(self.registry.all())
        """The served kinds' schemas: strategic merge patch, server-side apply, OpenAPI."""
        self.history_size = history_size
        self.watcher_buffer = watcher_buffer
        self._clock: Clock = clock or RealClock()
        self._rv = 1
        self._snapshot_cache: tuple[Any, list[tuple[_Key, KubeObject]]] | None = None
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}
        self._changed = asyncio.Event()
        for ns in initial_namespaces:
            self.create("namespaces", {"metadata": {"name": ns}})

    # ------------------------------------------------------------------ basics

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        return self._rv

    def resolve(self, resource: str | ResourceType) -> ResourceType:
        """Raises ``UnknownResourceError`` for an unknown name."""
        return self.registry.resolve(resource)

    def register(self, resource: ResourceType) -> ResourceType:
        """Serves a new resource type (a CRD) from now on."""
        self.schemas.add(resource)
        return self.registry.register(resource)

    def _bucket(self, rt: ResourceType) -> _Bucket:
        key = (rt.group, rt.version, rt.plural)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(rt)
        else:
            bucket.resource = rt
        return bucket

    def compacted_rv(self, resource: str | ResourceType) -> int:
        """The newest resourceVersion whose changes are no longer in the history."""
        return self._bucket(self.resolve(resource)).compacted_rv

    def counts(self) -> dict[str, int]:
        """Objects per resource (qualified name) — for tests and ``/_sim/state``."""
        return {b.resource.qualified: len(b.objects) for b in self._buckets.values()}

    def watcher_count(self) -> int:
        return sum(len(b.watchers) for b in self._buckets.values())

    def watchers(self) -> list[Watcher]:
        return [w for b in self._buckets.values() for w in b.watchers]

    def _scope_key(self, rt: ResourceType, name: str, namespace: str | None) -> _Key:
        if rt.namespaced:
            if not namespace:
                raise BadRequest(f"{rt.qualified} is namespaced: a namespace is required")
            return (namespace, name)
        return ("", name)

    def _commit(self, bucket: _Bucket, kind: str, key: _Key, obj: KubeObject,
                prev: KubeObject | None) -> None:
        if kind == "DELETED":
            del bucket.objects[key]
        else:
            bucket.objects[key] = obj
        change = Change(self._rv, kind, obj, prev)
        bucket.history.append(change)
        while len(bucket.history) > self.history_size:
            dropped = bucket.history.popleft()
            bucket.compacted_rv = dropped.rv
        for watcher in list(bucket.watchers):
            watcher.offer(change)
        self._changed.set()
        self._changed = asyncio.Event()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # ------------------------------------------------------------------ mutations

    def create(self, resource: str | ResourceType, obj: Mapping[str, Any], *,
               namespace: str | None = None, copy: bool = True, dry_run: bool = False,
               owner: FieldOwner | None = None) -> KubeObject:
        """Creates an object; 409 AlreadyExists when the name is taken.

        Every mutation returns a copy of the stored object; with ``copy=False`` it returns the stored
        object itself, which the caller must not change (the HTTP layer and the churn generator do this
        to save a copy). With ``dry_run`` nothing is stored and no resourceVersion is used (the answer
        has none, as kube-apiserver's); with ``owner`` the managedFields record the writer."""
        rt = self.resolve(resource)
        bucket = self._bucket(rt)
        new: KubeObject = _copy(obj)
        if not isinstance(new, dict):
            raise BadRequest("the object must be a JSON object")
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        if meta.get("resourceVersion"):
            raise BadRequest("resourceVersion should not be set on objects to be created")
        name = meta.get("name") or ""
        if not name:
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise Invalid(f"{rt.kind} \"\" is invalid: metadata.name: Required value: name or "
                              "generateName is required",
                              details={"kind": rt.kind, "causes": [
                                  {"reason": "FieldValueRequired", "field": "metadata.name"}]})
            alphabet = string.ascii_lowercase + string.digits
            name = prefix + "".join(secrets.choice(alphabet) for _ in range(5))
        ns_in_body = meta.get("namespace") or None
        if rt.namespaced:
            if namespace and ns_in_body and namespace != ns_in_body:
                raise BadRequest("the namespace of the provided object does not match the namespace "
                                 "sent on the request")
            ns = namespace or ns_in_body or "default"
        else:
            ns = ""
        key = (ns, name)
        if key in bucket.objects:
            raise AlreadyExists.object(plural=rt.plural, group=rt.group, name=name)
        meta = {k: v for k, v in meta.items() if k not in ("namespace", "uid", "creationTimestamp",
                                                               "generation", "resourceVersion")}
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        if rt.generation:
            meta["generation"] = 1
        meta["creationTimestamp"] = _rfc3339(self._clock.wall())
        stored: KubeObject = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
        stored.update({k: v for k, v in new.items() if k not in ("apiVersion", "kind", "metadata")})
        if owner is not None:
            record_update(self.schemas, self.schemas.kind(rt), None, stored, owner, with_status=False)
        if dry_run:
            return stored
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self._commit(bucket, "ADDED", key, stored, None)
        return _copy_obj(stored) if copy else stored

    def _current(self, rt: ResourceType, name: str,
                 namespace: str | None) -> tuple[_Bucket, _Key, KubeObject]:
        bucket = self._bucket(rt)
        key = self._scope_key(rt, name, namespace)
        existing = bucket.objects.get(key)
        if existing is None:
            raise NotFound.object(plural=rt.plural, group=rt.group, name=name)
        return bucket, key, existing

    def update(self, resource: str | ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None,
               subresource: str | None = None, copy: bool = True, dry_run: bool = False,
               owner: FieldOwner | None = None) -> KubeObject:
        """Replaces an object (PUT). A ``metadata.resourceVersion`` in ``obj`` is a precondition
        (409 Conflict when stale). On the main resource of a type with a status subresource the status
        is kept; with ``subresource="status"`` only the status changes. An update that changes nothing
        is a no-op and keeps the resourceVersion, as kube-apiserver does."""
        rt = self.resolve(resource)
        meta_in = obj.get("metadata") or {}
        name = str(meta_in.get("name") or "")
        if not name:
            raise BadRequest("metadata.name is required")
        ns = namespace or meta_in.get("namespace") or None
        if rt.namespaced and namespace and meta_in.get("namespace") and meta_in["namespace"] != namespace:
            raise BadRequest("the namespace of the provided object does not match the namespace sent "
                             "on the request")
        bucket, key, existing = self._current(rt, name, ns if rt.namespaced else None)
        stored = self._replace(bucket, key, existing, _copy_obj(obj), subresource, dry_run=dry_run,
                               owner=owner)
        return _copy_obj(stored) if copy else stored

    def _replace(self, bucket: _Bucket, key: _Key, existing: KubeObject, new: KubeObject,
                 subresource: str | None, *, dry_run: bool = False,
                 owner: FieldOwner | None = None) -> KubeObject:
        """Commits ``new`` over ``existing`` and returns the stored result (or ``existing`` when
        nothing changed). ``new`` must be the caller's own (it is kept); unchanged subtrees may be
        shared with ``existing``, which is never mutated. ``dry_run``: the result, not committed."""
        rt = bucket.resource
        old_meta = existing["metadata"]
        meta = new.get("metadata") if isinstance(new.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and str(wanted_rv) != old_meta["resourceVersion"]:
            raise Conflict.stale(plural=rt.plural, group=rt.group, name=key[1])
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise Conflict(f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                           f"{old_meta['uid']}")
        if subresource == "status":
            result: KubeObject = dict(existing)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            result["metadata"] = dict(old_meta)
        elif subresource:
            raise NotFound(f"the server could not find the requested resource ({subresource})")
        else:
            merged_meta = {k: v for k, v in meta.items() if k not in ("resourceVersion", "generation")}
            if "managedFields" not in meta and "managedFields" in old_meta:
                merged_meta["managedFields"] = old_meta["managedFields"]
            for fixed in ("name", "uid", "creationTimestamp", "generation"):
                if fixed in old_meta:
                    merged_meta[fixed] = old_meta[fixed]
            if rt.namespaced:
                merged_meta["namespace"] = old_meta["namespace"]
            else:
                merged_meta.pop("namespace", None)
            result = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": merged_meta}
            result.update({k: v for k, v in new.items()
                           if k not in ("apiVersion", "kind", "metadata", "status")})
            if rt.has_status:
                if "status" in existing:
                    result["status"] = existing["status"]
            elif "status" in new:
                result["status"] = new["status"]
            if rt.generation and _spec_part(result) != _spec_part(existing):
                merged_meta["generation"] = int(old_meta.get("generation", 1)) + 1
        result["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if owner is not None:
            record_update(self.schemas, self.schemas.kind(rt), existing, result, owner,
                          with_status=not rt.has_status)
        if result == existing:
            return existing
        if dry_run:
            return result
        result["metadata"]["resourceVersion"] = self._next_rv()
        self._commit(bucket, "MODIFIED", key, result, existing)
        return result

    def patch(self, resource: str | ResourceType, name: str, patch: Any, *, namespace: str | None = None,
              patch_type: str = PatchType.MERGE, subresource: str | None = None,
              copy: bool = True, dry_run: bool = False, owner: FieldOwner | None = None) -> KubeObject:
        """Applies a JSON merge patch, a strategic merge patch (built-in kinds) or a JSON patch, then
        updates (server-side apply is :meth:`apply`)."""
        rt = self.resolve(resource)
        bucket, key, existing = self._current(rt, name, namespace)
        if patch_type == PatchType.STRATEGIC and rt.crd:
            raise UnsupportedMediaType(
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{PatchType.JSON}, {PatchType.MERGE}, {PatchType.APPLY}")
        if patch_type in (PatchType.MERGE, PatchType.STRATEGIC):
            if not isinstance(patch, dict):
                raise BadRequest("a merge patch must be a JSON object")
            # Builds new dicts along the patched paths only; the rest is shared, never mutated.
            if patch_type == PatchType.STRATEGIC:
                doc = strategic_merge_patch(existing, patch, self.schemas, self.schemas.kind(rt))
            else:
                doc = json_merge_patch(existing, patch)
            patch_meta = patch.get("metadata")
            preconditioned = isinstance(patch_meta, dict) and "resourceVersion" in patch_meta
        elif patch_type == PatchType.JSON:
            doc = apply_json_patch(existing, patch)
            preconditioned = doc.get("metadata", {}).get("resourceVersion") != existing["metadata"][
                "resourceVersion"]
        else:
            raise UnsupportedMediaType(f"the body of the request was in an unknown format - accepted "
                                          f"media types include: {', '.join(PatchType.ALL)}")
        if not isinstance(doc, dict):
            raise BadRequest("the patched object is not a JSON object")
        meta = dict(doc["metadata"]) if isinstance(doc.get("metadata"), dict) else {}
        if meta.get("name") != name:
            raise BadRequest("the name of the object cannot be changed by a patch")
        if not preconditioned:
            meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
        doc["metadata"] = meta
        stored = self._replace(bucket, key, existing, doc, subresource, dry_run=dry_run, owner=owner)
        return _copy_obj(stored) if copy else stored

    def apply(self, resource: str | ResourceType, name: str, config: Mapping[str, Any], *,
              namespace: str | None = None, owner: FieldOwner, force: bool = False,
              subresource: str | None = None, dry_run: bool = False, copy: bool = True) -> KubeObject:
        """Server-side apply of ``config`` by ``owner``: creates the object when missing, else merges
        it in with field ownership (409 Conflict on another manager's field unless ``force``)."""
        rt = self.resolve(resource)
        if not isinstance(config, Mapping):
            raise BadRequest("an apply patch must be an object")
        meta_in = config.get("metadata") if isinstance(config.get("metadata"), Mapping) else {}
        assert isinstance(meta_in, Mapping)
        if meta_in.get("name") not in (None, name):
            raise BadRequest("the name of the object does not match the name on the URL")
        for field_name, expected in (("apiVersion", rt.api_version), ("kind", rt.kind)):
            if config.get(field_name) != expected:
                raise BadRequest(f"{field_name} must be {expected!r} in an apply patch for {rt.qualified}, "
                                 f"not {config.get(field_name)!r}")
        schema = self.schemas.kind(rt)
        bucket = self._bucket(rt)
        key = self._scope_key(rt, name, namespace)
        existing = bucket.objects.get(key)
        with_status = not rt.has_status or subresource == "status"
        if existing is None:
            if subresource:
                raise NotFound.object(plural=rt.plural, group=rt.group, name=name)
            applied = apply_config(self.schemas, schema, None, config, owner, force=force,
                                   with_status=with_status)
            applied.setdefault("metadata", {})["name"] = name
            # The applied object carries its managedFields already: created as it is.
            return self.create(rt, applied, namespace=namespace, copy=copy, dry_run=dry_run)
        applied = apply_config(self.schemas, schema, existing, config, owner, force=force,
                               with_status=with_status)
        meta = dict(applied["metadata"])
        meta["resourceVersion"] = meta_in.get("resourceVersion") or existing["metadata"]["resourceVersion"]
        old_annotations = existing["metadata"].get("annotations") or {}
        if _LAST_APPLIED in old_annotations:
            # kube-apiserver keeps kubectl's client-side record in step with what is applied server-side,
            # so that a later client-side apply computes its patch from the right base.
            meta["annotations"] = {**(meta.get("annotations") or {}),
                                   _LAST_APPLIED: orjson.dumps(config).decode() + "\n"}
        applied["metadata"] = meta
        stored = self._replace(bucket, key, existing, applied, subresource, dry_run=dry_run)
        return _copy_obj(stored) if copy else stored

    def has_namespace(self, namespace: str) -> bool:
        """Whether the Namespace exists."""
        return ("", namespace) in self._bucket(self.resolve("namespaces")).objects

    def delete(self, resource: str | ResourceType, name: str, *, namespace: str | None = None,
               precondition_rv: str | None = None, precondition_uid: str | None = None,
               copy: bool = True, dry_run: bool = False) -> KubeObject:
        """Deletes at once and returns the last state, carrying the delete's resourceVersion. Deleting
        a Namespace deletes every object in it first (what the namespace controller does)."""
        rt = self.resolve(resource)
        bucket, key, existing = self._current(rt, name, namespace)
        meta = existing["metadata"]
        if precondition_rv and precondition_rv != meta["resourceVersion"]:
            raise Conflict(f"Precondition failed: ResourceVersion in precondition: {precondition_rv}, "
                           f"ResourceVersion in object meta: {meta['resourceVersion']}")
        if precondition_uid and precondition_uid != meta["uid"]:
            raise Conflict(f"Precondition failed: UID in precondition: {precondition_uid}, UID in object "
                           f"meta: {meta['uid']}")
        if dry_run:
            return _copy_obj(existing) if copy else existing
        if rt.group == "" and rt.plural == "namespaces":
            for other in list(self._buckets.values()):
                if other.resource.namespaced:
                    for obj_key in [k for k in other.objects if k[0] == name]:
                        self.delete(other.resource, obj_key[1], namespace=name, copy=False)
        final = dict(existing)
        final["metadata"] = {**meta, "resourceVersion": self._next_rv()}
        self._commit(bucket, "DELETED", key, final, existing)
        return _copy_obj(final) if copy else final

    def compact(self) -> int:
        """Drops every history entry now (as an etcd compaction at the current RV); returns that RV."""
        for bucket in self._buckets.values():
            bucket.history.clear()
            bucket.compacted_rv = self._rv
        return self._rv

    # ------------------------------------------------------------------ reads

    def get(self, resource: str | ResourceType, name: str, *, namespace: str | None = None) -> KubeObject:
        """A copy of the object; 404 NotFound when missing."""
        rt = self.resolve(resource)
        return _copy_obj(self._current(rt, name, namespace)[2])

    def get_raw(self, rt: ResourceType, name: str, namespace: str | None) -> KubeObject:
        """The stored object itself: callers must not change it."""
        return self._current(rt, name, namespace)[2]

    def snapshot(self, rt: ResourceType, *, at_rv: int | None = None,
                 scope: WatchFilter | None = None) -> list[tuple[_Key, KubeObject]]:
        """The matching objects at ``at_rv`` (None = now), sorted by key; shared, read-only objects
        in a shared, read-only list (the last answer is reused while nothing changed).

        An older ``at_rv`` is rebuilt by undoing newer history entries; 410 Expired when the history
        no longer reaches back that far.
        """
        bucket = self._bucket(rt)
        effective = at_rv if at_rv is not None and at_rv < self._rv else None
        cache_key = (rt, effective, self._rv, bucket.compacted_rv, scope)
        cached = self._snapshot_cache
        if cached is not None and cached[0] == cache_key:
            # Nothing changed since the last call (pages of one list): same objects, same order.
            return cached[1]
        objects: Mapping[_Key, KubeObject] = bucket.objects
        if at_rv is not None and at_rv < self._rv:
            if at_rv < bucket.compacted_rv:
                raise Expired(f"too old resource version: {at_rv} ({bucket.compacted_rv})")
            rebuilt = dict(bucket.objects)
            for change in reversed(bucket.history):
                if change.rv <= at_rv:
                    break
                key = (change.obj["metadata"].get("namespace", ""), change.obj["metadata"]["name"])
                if change.prev is None:
                    rebuilt.pop(key, None)
                else:
                    rebuilt[key] = change.prev
            objects = rebuilt
        items = sorted(objects.items())
        if scope is not None:
            items = [(k, o) for k, o in items if scope.matches(o)]
        self._snapshot_cache = (cache_key, items)
        return items

    def list(self, resource: str | ResourceType, *, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None) -> list[KubeObject]:
        """Copies of the current matching objects, sorted by namespace and name."""
        rt = self.resolve(resource)
        scope = WatchFilter.parse(namespace=namespace, label_selector=label_selector,
                                  field_selector=field_selector)
        return [_copy(o) for _, o in self.snapshot(rt, scope=scope)]

    async def wait_for_rv(self, rv: int, timeout: float) -> bool:
        """Waits until the store's resourceVersion reaches ``rv``; False after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._rv < rv:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except TimeoutError:
                return self._rv >= rv
        return True

    # ------------------------------------------------------------------ watch

    def watch(self, rt: ResourceType, *, from_rv: int | None, scope: WatchFilter,
              max_buffer: int | None = None) -> Watcher:
        """Registers a watcher.

        ``from_rv=None``: ``initial`` holds the current matching objects as synthetic ADDED changes and
        live changes follow. Otherwise every change after ``from_rv`` is replayed from the history
        first; 410 Expired (message ``too old resource version: N (M)``) when it is gone.
        """
        bucket = self._bucket(rt)
        initial: list[Change] = []
        backlog: list[Change] = []
        if from_rv is None:
            initial = [Change(int(o["metadata"]["resourceVersion"]), "ADDED", o)
                       for _, o in self.snapshot(rt, scope=scope)]
        else:
            if from_rv < bucket.compacted_rv:
                raise Expired(f"too old resource version: {from_rv} ({bucket.compacted_rv})")
            backlog = _newer_than(bucket.history, from_rv)
        watcher = Watcher(store=self, resource=rt, scope=scope, start_rv=self._rv, initial=initial,
                          backlog=backlog, max_buffer=max_buffer or self.watcher_buffer)
        bucket.watchers.add(watcher)
        return watcher

    def _unregister(self, watcher: Watcher) -> None:
        rt = watcher.resource
        bucket = self._buckets.get((rt.group, rt.version, rt.plural))
        if bucket is not None:
            bucket.watchers.discard(watcher)

    def close_watchers(self, reason: str = "stopped", *, error: dict[str, Any] | None = None) -> int:
        """Closes every open watch (optionally with an ERROR Status); returns how many."""
        watchers = self.watchers()
        for watcher in watchers:
            watcher.close(reason, error=error)
        return len(watchers)
