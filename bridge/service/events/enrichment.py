"""Enrichment of Kubernetes Events: the involved object's labels, annotations and owner chain.

An Event names its object (``involvedObject`` / ``regarding``: kind, namespace, name, uid) but not
what consumers route and aggregate by: the object's labels (team, app), some of its annotations, and
the controller behind it (the Deployment behind a Pod, through its ReplicaSet). The bridge reads
them from its own caches, never with a request per Event:

- one **metadata-only informer** per involved kind (``PartialObjectMetadata``: the API server
  answers lists and watches with each object's ``metadata`` alone, see
  :data:`bridge.kube.listwatch.METADATA_ACCEPT`), run by the project's :class:`~bridge.informer.
  reflector.Reflector` into a :class:`MetadataStore`;
- **started lazily**: a kind's informer starts when the first Event about that kind (or an owner
  reference to it) needs it, and only for the kinds configured (``events.enrichment.kinds``: what
  the chart's RBAC grants); an Event about another kind is answered ``skipped``;
- **bounded**: an entry keeps the uid, the labels, the configured annotations and the controller
  reference, nothing else (about 430 bytes for a Pod with three labels, measured in
  ``docs/performance.md``); at ``max_objects`` entries per kind, further objects are not cached
  (their Events answer ``unknown``, counted in :attr:`MetadataStore.overflow`);
- **objects already gone**: a deleted object's entry moves to a bounded memory of the last
  ``max_gone`` deletions (by uid), so an Event arriving after its Pod was deleted (``Killing``,
  ``FailedKillPod``, or any Event of a burst the bridge is catching up with) still gets the
  labels the object had, with ``enrichment: gone``. A uid the bridge never saw answers
  ``unknown``: deleted before the bridge started or before its cache listed it, or beyond the
  memory of deletions. An object re-created under the same name is another uid: an Event about the
  old one is ``gone`` (or ``unknown``), never given the new object's labels.

A kind's cache starts when it is first needed, and a bridge restarts: deletions that happened
before its list are not in it. So a starting cache also reads the deletions since the oldest Event
looked up so far (and since the checkpoint, :attr:`Enricher.replay_since`) from the API server's
watch history, as long as the server keeps it (:meth:`Enricher._replay`).

An Event can be watched before its object: the Event informer and the object's informer are two
watches. An ``added`` Event whose object is not in the cache yet waits (at most
``events.enrichment.wait`` seconds) while that cache is behind the Event's resourceVersion; if the
object is still missing, its metadata is read once from the API server (a watch lagging under load;
one request per such miss, counted in :attr:`Enricher.reads`), and an object not there is
``unknown``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from bridge.clock import Clock
from bridge.contracts import KubeObject, WatchEventType, WatchOptions
from bridge.errors import ApiError, ApiStatusError, NotFoundError
from bridge.informer.reflector import Reflector
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource, Discovery
from bridge.kube.listwatch import METADATA_ACCEPT, HttpListerWatcher
from bridge.resource_version import parse_rv
from sinks.eventfacts import InvolvedObject

__all__ = ["Enricher", "Enrichment", "EnrichmentStatus", "MetaEntry", "MetadataStore", "Owner"]

log = logging.getLogger(__name__)


class EnrichmentStatus:
    """The values of the ``enrichment`` attribute."""

    OK: Final = "ok"
    """The object is in the cache: its labels, annotations and owners are current."""
    GONE: Final = "gone"
    """The object was deleted: its last known labels, annotations and owners."""
    UNKNOWN: Final = "unknown"
    """The bridge has no record of this uid (see the module docstring)."""
    SKIPPED: Final = "skipped"
    """The involved kind is not among ``events.enrichment.kinds`` (or not served)."""


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    name: str
    uid: str


class MetaEntry:
    """What the cache keeps of one object."""

    __slots__ = ("_json", "annotations", "controller", "labels", "uid")

    def __init__(self, uid: str, labels: dict[str, str], annotations: dict[str, str],
                 controller: tuple[str, str, str, str] | None) -> None:
        self.uid = uid
        self.labels = labels
        self.annotations = annotations
        self.controller = controller
        """(kind, apiVersion, name, uid) of the controlling owner reference, if any."""
        self._json: tuple[str, str] | None = None

    def json(self) -> tuple[str, str]:
        """The labels and the annotations as the attributes carry them (sorted JSON objects, "" when
        empty), encoded once per entry rather than once per Event."""
        if self._json is None:
            def enc(m: dict[str, str]) -> str:
                return orjson.dumps(m, option=orjson.OPT_SORT_KEYS).decode() if m else ""
            self._json = (enc(self.labels), enc(self.annotations))
        return self._json


_EMPTY: dict[str, str] = {}


def _entry(obj: Mapping[str, Any], annotation_keys: frozenset[str]) -> tuple[str, MetaEntry] | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name = str(meta.get("name") or "")
    ns = str(meta.get("namespace") or "")
    labels = meta.get("labels")
    labels = {sys.intern(str(k)): sys.intern(str(v)) for k, v in labels.items()} \
        if isinstance(labels, Mapping) and labels else _EMPTY
    annotations: dict[str, str] = _EMPTY
    raw_ann = meta.get("annotations")
    if annotation_keys and isinstance(raw_ann, Mapping):
        annotations = {k: str(raw_ann[k]) for k in annotation_keys if k in raw_ann} or _EMPTY
    controller = None
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            controller = (sys.intern(str(ref.get("kind") or "")),
                          sys.intern(str(ref.get("apiVersion") or "")),
                          str(ref.get("name") or ""), str(ref.get("uid") or ""))
            break
    return f"{ns}/{name}", MetaEntry(str(meta.get("uid") or ""), labels, annotations, controller)


class MetadataStore:
    """The reflector's store for one kind: entries by ``namespace/name``, plus the last deletions
    by uid. Bounded: ``max_objects`` live entries, ``max_gone`` remembered deletions."""

    def __init__(self, *, annotation_keys: Sequence[str], max_objects: int, max_gone: int) -> None:
        self.annotation_keys = frozenset(annotation_keys)
        self._max_objects = max_objects
        self._max_gone = max_gone
        self.live: dict[str, MetaEntry] = {}
        self.gone: collections.OrderedDict[str, MetaEntry] = collections.OrderedDict()
        self.overflow = 0
        """Objects not cached because ``max_objects`` was reached."""
        self.synced = asyncio.Event()
        self.changed = asyncio.Event()
        """Set on every change and cleared by whoever waits for the next."""
        self.resource_version = ""

    def _put(self, obj: KubeObject) -> None:
        found = _entry(obj, self.annotation_keys)
        if found is None:
            return
        key, entry = found
        old = self.live.get(key)
        if old is not None and old.uid != entry.uid:
            self._forget(old)
        if old is None and len(self.live) >= self._max_objects:
            self.overflow += 1
            return
        self.live[key] = entry
        self._note(obj)

    def _forget(self, entry: MetaEntry) -> None:
        if not entry.uid or not self._max_gone:
            return
        self.gone[entry.uid] = entry
        self.gone.move_to_end(entry.uid)
        while len(self.gone) > self._max_gone:
            self.gone.popitem(last=False)

    def _note(self, obj: KubeObject) -> None:
        meta = obj.get("metadata")
        if isinstance(meta, Mapping) and meta.get("resourceVersion"):
            self.resource_version = str(meta["resourceVersion"])
        self.changed.set()

    def add(self, obj: KubeObject) -> None:
        self._put(obj)

    def update(self, obj: KubeObject) -> None:
        self._put(obj)

    def delete(self, obj: KubeObject) -> None:
        found = _entry(obj, self.annotation_keys)
        if found is None:
            return
        key, entry = found
        old = self.live.pop(key, None)
        self._forget(old if old is not None and old.uid == entry.uid else entry)
        self._note(obj)

    def remember_deleted(self, obj: KubeObject) -> None:
        """A deletion read from the watch history (see :meth:`Enricher.replay_deletions_since`):
        remembered unless the object is live (a uid deleted is never live again, but be safe)."""
        found = _entry(obj, self.annotation_keys)
        if found is None:
            return
        key, entry = found
        live = self.live.get(key)
        if live is None or live.uid != entry.uid:
            self._forget(entry)

    def replace(self, items: list[KubeObject], resource_version: str) -> None:
        before = self.live
        self.live = {}
        for obj in items:
            self._put(obj)
        for key, entry in before.items():
            now = self.live.get(key)
            if now is None or now.uid != entry.uid:
                self._forget(entry)
        self.resource_version = resource_version
        self.synced.set()
        self.changed.set()

    def resync(self) -> None:
        """Nothing to do: a cache, not a queue."""

    def find(self, namespace: str, name: str, uid: str) -> tuple[str, MetaEntry | None]:
        """(status, entry) for the object ``namespace/name`` with ``uid`` ("" = any uid)."""
        entry = self.live.get(f"{namespace}/{name}")
        if entry is not None and (not uid or entry.uid == uid):
            return EnrichmentStatus.OK, entry
        if uid:
            gone = self.gone.get(uid)
            if gone is not None:
                return EnrichmentStatus.GONE, gone
        return EnrichmentStatus.UNKNOWN, None


@dataclass(frozen=True, slots=True)
class Enrichment:
    status: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owners: tuple[Owner, ...]
    """From the direct controller up to the top one (the Deployment behind a Pod's ReplicaSet)."""
    labels_json: str = ""
    annotations_json: str = ""


_SKIPPED = Enrichment(EnrichmentStatus.SKIPPED, _EMPTY, _EMPTY, ())
_UNKNOWN = Enrichment(EnrichmentStatus.UNKNOWN, _EMPTY, _EMPTY, ())


class _KindCache:
    def __init__(self, *, api: APIResource, store: MetadataStore, reflector: Reflector,
                 lister_watcher: HttpListerWatcher) -> None:
        self.api = api
        self.store = store
        self.reflector = reflector
        self.lister_watcher = lister_watcher
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        """Set once the cache synced and the deletions since the replay point were read."""


_REPLAY_IDLE = 2.0
_OLDEST = re.compile(r"too old resource version: \d+ \((\d+)\)")
"""kube-apiserver's 410 for a watch older than its history names the oldest resourceVersion kept."""
"""Seconds without a watch event after which the replayed history is taken as complete."""


def _rv_int(rv: str) -> int | None:
    return parse_rv(rv)


class Enricher:
    """Answers :meth:`lookup` from metadata caches of the configured kinds, started on first use."""

    def __init__(self, *, client: ApiClient, discovery: Discovery, clock: Clock, kinds: Sequence[str],
                 annotations: Sequence[str] = (), max_objects: int = 200_000, max_gone: int = 10_000,
                 wait: float = 1.0, sync_timeout: float = 10.0, max_owner_depth: int = 4,
                 page_size: int = 500) -> None:
        self._client = client
        self._discovery = discovery
        self._clock = clock
        self._kinds = tuple(kinds)
        self._annotations = tuple(annotations)
        self._max_objects = max_objects
        self._max_gone = max_gone
        self._wait = wait
        self._sync_timeout = sync_timeout
        self._max_depth = max_owner_depth
        self._page_size = page_size
        self._allowed: dict[tuple[str, str], APIResource] | None = None
        """(group, Kind) → resource, for the configured kinds (resolved on first use)."""
        self._caches: dict[tuple[str, str], _KindCache] = {}
        self._resolving: asyncio.Lock | None = None
        self._closed = False
        self.replay_since = ""
        """A resourceVersion to read deletions from when a kind's cache starts (the checkpoint's of
        the Event informers: see :meth:`_replay`); "" = none."""
        self.replayed_deletions = 0
        self.reads = 0
        """Objects read from the API server because the cache lagged (see :meth:`_read`)."""
        self._earliest_rv: int | None = None
        """The oldest resourceVersion of an Event looked up so far: a kind's cache started for it
        replays the deletions since then too (the first start has no checkpoint)."""

    @property
    def caches(self) -> dict[tuple[str, str], MetadataStore]:
        """(group, Kind) → the store of every informer started so far."""
        return {k: c.store for k, c in self._caches.items()}

    async def _resolve_kinds(self) -> dict[tuple[str, str], APIResource]:
        if self._allowed is not None:
            return self._allowed
        if self._resolving is None:
            self._resolving = asyncio.Lock()
        async with self._resolving:
            if self._allowed is None:
                allowed: dict[tuple[str, str], APIResource] = {}
                for name in self._kinds:
                    try:
                        api = await self._discovery.resolve(name)
                    except Exception as e:  # a kind this cluster does not serve: its Events are skipped
                        log.warning("events enrichment: %s is not served (%s); its Events are not enriched",
                                    name, e)
                        continue
                    allowed[(api.group, api.kind)] = api
                self._allowed = allowed
        return self._allowed

    def _cache_now(self, group: str, kind: str) -> _KindCache | None:
        return self._caches.get((group, kind))

    async def _cache(self, group: str, kind: str) -> _KindCache | None:
        """The kind's cache, its informer started (and waited for, up to ``sync_timeout``) on first
        use; None when the kind is not configured."""
        found = self._caches.get((group, kind))
        if found is None:
            if self._closed:
                return None
            allowed = await self._resolve_kinds()
            api = allowed.get((group, kind))
            if api is None:
                return None
            found = self._caches.get((group, kind))
            if found is None:
                store = MetadataStore(annotation_keys=self._annotations, max_objects=self._max_objects,
                                      max_gone=self._max_gone)
                lw = HttpListerWatcher(client=self._client, resource=api, accept=METADATA_ACCEPT)
                reflector = Reflector(name=f"metadata:{api.qualified}", lister_watcher=lw, store=store,
                                      clock=self._clock, page_size=self._page_size)
                found = _KindCache(api=api, store=store, reflector=reflector, lister_watcher=lw)
                found.task = asyncio.create_task(self._start(found), name=f"events-metadata-{api.qualified}")
                self._caches[(group, kind)] = found
                log.info("events enrichment: watching the metadata of %s", api.qualified)
        if not found.ready.is_set():
            try:
                async with asyncio.timeout(self._sync_timeout):
                    await found.ready.wait()
            except TimeoutError:
                log.warning("events enrichment: the metadata of %s did not sync within %.0f s",
                            found.api.qualified, self._sync_timeout)
        return found

    async def _start(self, cache: _KindCache) -> None:
        name = f"events-metadata-reflector-{cache.api.qualified}"
        run = asyncio.create_task(cache.reflector.run(), name=name)
        try:
            await cache.store.synced.wait()
            try:
                await self._replay(cache)
            except Exception as e:  # a history the server no longer has: deletions unknown
                log.warning("events enrichment: the deletions of %s before its list could not be read "
                            "(%s); Events about objects deleted then answer 'unknown'",
                            cache.api.qualified, e)
            cache.ready.set()
            await run
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)

    def _replay_point(self) -> int | None:
        """Where a starting cache reads deletions from: the checkpoint's resourceVersion (a restart
        re-sends from there) or just before the oldest Event looked up so far, whichever is older."""
        points = [p for p in (_rv_int(self.replay_since),
                              None if self._earliest_rv is None else self._earliest_rv - 1) if p is not None]
        return min(points) if points else None

    async def _replay(self, cache: _KindCache) -> None:
        """Reads the deletions the API server still has in its watch history, up to the cache's
        list, into the store's memory of deletions: a bridge restarted from a checkpoint re-sends
        Events changed since then, and the objects they name may have been deleted while it was
        down, or before (an Event that expires after the restart about a Pod deleted earlier).

        It asks for the history from resourceVersion 1: a server that keeps it all (the simulator
        with a long history) answers it; kube-apiserver answers 410 ``too old resource version: 1
        (OLDEST)``, and the replay starts at OLDEST, the oldest it keeps (a few minutes). Without
        that number it starts at :meth:`_replay_point` (the checkpoint, or the oldest Event looked
        up), which the history must still hold."""
        try:
            await self._replay_from(cache, 1)
        except ApiStatusError as e:
            if e.code != 410:
                raise
            oldest = _OLDEST.search(str(e))
            point = int(oldest.group(1)) if oldest else self._replay_point()
            if point is not None:
                await self._replay_from(cache, point)

    async def _replay_from(self, cache: _KindCache, since: int) -> None:
        until = _rv_int(cache.store.resource_version)
        if until is None or since >= until:
            return
        stream = await cache.lister_watcher.watch(WatchOptions(resource_version=str(since),
                                                               timeout_seconds=30))
        events = aiter(stream)
        try:
            while True:
                try:
                    # The history arrives at once; a pause means it is over (the newest changes
                    # of this kind may be older than the list, whose resourceVersion is global).
                    event = await asyncio.wait_for(anext(events), _REPLAY_IDLE)
                except (TimeoutError, StopAsyncIteration):
                    break
                if event.type is WatchEventType.ERROR:
                    code = int(event.object.get("code") or 500)
                    raise ApiStatusError(str(event.object.get("message") or "watch error"), code=code)
                meta = event.object.get("metadata")
                rv = _rv_int(str(meta.get("resourceVersion") or "")) if isinstance(meta, Mapping) else None
                if event.type is WatchEventType.DELETED:
                    cache.store.remember_deleted(event.object)
                    self.replayed_deletions += 1
                if rv is not None and rv >= until:
                    break
        finally:
            await stream.close()

    async def lookup(self, involved: InvolvedObject, *, event_rv: str = "", wait: bool = False) -> Enrichment:
        """The enrichment of ``involved``. ``wait``: an object not (yet) in the cache is waited for
        while the cache is behind ``event_rv`` (up to ``wait`` seconds, see the module docstring)."""
        if not involved.kind or not involved.name:
            return _UNKNOWN
        rv = _rv_int(event_rv)
        if rv is not None and (self._earliest_rv is None or rv < self._earliest_rv):
            self._earliest_rv = rv
        cache = await self._cache(involved.group, involved.kind)
        if cache is None:
            return _SKIPPED
        store = cache.store
        status, entry = store.find(involved.namespace, involved.name, involved.uid)
        if entry is None and not cache.ready.is_set():
            status, entry = await self._read(cache, involved)  # the cache is still being filled
        elif entry is None and wait and self._wait > 0:
            status, entry = await self._wait_for(store, involved, event_rv)
            have, target = _rv_int(store.resource_version), _rv_int(event_rv)
            caught_up = have is not None and target is not None and have >= target
            if entry is None and not caught_up:
                status, entry = await self._read(cache, involved)
        if entry is None:
            return _UNKNOWN
        owners = await self._owners(entry, involved.namespace)
        return Enrichment(status, entry.labels, entry.annotations, owners, *entry.json())

    def lookup_now(self, involved: InvolvedObject) -> Enrichment | None:
        """:meth:`lookup` without waiting, when it can answer at once (the kind's cache and every
        owner's are running and synced, and the object is cached or its deletion remembered); else
        None."""
        cache = self._cache_now(involved.group, involved.kind)
        if cache is None or not cache.ready.is_set():
            if self._allowed is not None and (involved.group, involved.kind) not in self._allowed:
                return _SKIPPED
            return None
        status, entry = cache.store.find(involved.namespace, involved.name, involved.uid)
        if entry is None:
            return None
        owners: list[Owner] = []
        current = entry
        for _ in range(self._max_depth):
            ref = current.controller
            if ref is None:
                break
            kind, api_version, name, uid = ref
            owners.append(Owner(kind, name, uid))
            owner_cache = self._cache_now(api_version.rpartition("/")[0], kind)
            if owner_cache is None:
                if self._allowed is not None and (api_version.rpartition("/")[0], kind) not in self._allowed:
                    break
                return None
            if not owner_cache.ready.is_set():
                return None
            ns = involved.namespace if owner_cache.api.namespaced else ""
            _, found = owner_cache.store.find(ns, name, uid)
            if found is None:
                break
            current = found
        return Enrichment(status, entry.labels, entry.annotations, tuple(owners), *entry.json())

    async def _read(self, cache: _KindCache, involved: InvolvedObject) -> tuple[str, MetaEntry | None]:
        """The object's metadata read from the API server: the last resort for a new Event whose
        object the cache still lacks after the wait (a watch lagging behind under load). Not put in
        the cache, whose order is the watch's; an object that is not there (or has another uid) is
        ``unknown``."""
        api = cache.api
        path = api.object_path(involved.name, involved.namespace if api.namespaced else None)
        try:
            obj, _ = await self._client.get_negotiated(path, accept=METADATA_ACCEPT[1],
                                                       context=f"reading the metadata of {api.qualified} "
                                                               f"{involved.namespace}/{involved.name}")
        except NotFoundError:
            return EnrichmentStatus.UNKNOWN, None
        except ApiError as e:
            log.debug("events enrichment: %s", e)
            return EnrichmentStatus.UNKNOWN, None
        self.reads += 1
        found = _entry(obj, cache.store.annotation_keys)
        if found is None or (involved.uid and found[1].uid != involved.uid):
            return EnrichmentStatus.UNKNOWN, None
        return EnrichmentStatus.OK, found[1]

    async def _wait_for(self, store: MetadataStore, involved: InvolvedObject,
                        event_rv: str) -> tuple[str, MetaEntry | None]:
        target = _rv_int(event_rv)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        status, entry = store.find(involved.namespace, involved.name, involved.uid)
        while entry is None:
            have = _rv_int(store.resource_version)
            if target is not None and have is not None and have >= target:
                break  # the cache has seen everything up to the Event: the object is not coming
            left = deadline - loop.time()
            if left <= 0:
                break
            store.changed.clear()
            try:
                async with asyncio.timeout(min(left, 0.05)):
                    await store.changed.wait()
            except TimeoutError:
                pass
            status, entry = store.find(involved.namespace, involved.name, involved.uid)
        return status, entry

    async def _owners(self, entry: MetaEntry, namespace: str) -> tuple[Owner, ...]:
        owners: list[Owner] = []
        current = entry
        for _ in range(self._max_depth):
            ref = current.controller
            if ref is None:
                break
            kind, api_version, name, uid = ref
            owners.append(Owner(kind, name, uid))
            cache = await self._cache(api_version.rpartition("/")[0], kind)
            if cache is None:
                break
            _, found = cache.store.find(namespace if cache.api.namespaced else "", name, uid)
            if found is None:
                break
            current = found
        return tuple(owners)

    async def close(self) -> None:
        self._closed = True
        for cache in self._caches.values():
            cache.reflector.stop()
            cache.ready.set()
        tasks = [c.task for c in self._caches.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
