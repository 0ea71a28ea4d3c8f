"""``namespace_selector``: one cluster-wide watch, keeping only the objects of namespaces whose labels
match.

The Kubernetes API has no selector on a namespace's labels for other resources: a bridge that must
follow "every namespace labelled ``team=payments``" would otherwise run one informer per namespace
(one list and one watch each, and a configuration to keep in step with the cluster). Here a resource
is watched once, cluster-wide, and the objects of the other namespaces are dropped where they enter
(:class:`NamespaceFilteredListerWatcher`): a list item is not returned, a watch event becomes a
bookmark at its resourceVersion, so the resume point moves while nothing of it is cached or sent.

Which namespaces match is decided by one Namespace watch for the whole service
(:class:`NamespaceLabels`: a reflector over ``namespaces`` keeping each one's labels, with the
project's label-selector implementation, :mod:`bridge.kube.labels`). When the set of matching
namespaces of a selector changes (a namespace labelled, unlabelled, created or deleted), the open
watch of every resource under that selector ends with an ``ERROR`` 410 event, as an expired watch
does, so its reflector relists: the relist, filtered by the new set, brings the objects of a
namespace that now matches as ``added``, and the objects of one that no longer matches are no longer
listed, so the relist infers their deletes, which the bridge tells from real deletes as it does for
any selector (:mod:`bridge.delivery.selector_exit`: the object still exists, the event is marked
``leftselector``). Each such change costs one cluster-wide list of each resource under the selector
(counted in ``keb_informer_expired_total``): namespaces are relabelled rarely; a label that flips
every few seconds would keep the resource relisting.

Until the Namespace watch has synced nothing matches; the service waits for it before it starts
the informers, so their first list is filtered by the real set.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from bridge.clock import Clock
from bridge.contracts import (
    DeletedFinalStateUnknown,
    KubeObject,
    ListerWatcher,
    ListOptions,
    ListPage,
    ObjectKey,
    WatchEvent,
    WatchEventType,
    WatchOptions,
    WatchStream,
)
from bridge.informer.reflector import Reflector
from bridge.kube.labels import LabelSelector, parse_label_selector

__all__ = ["NamespaceFilteredListerWatcher", "NamespaceLabels", "NamespaceScope"]

log = logging.getLogger(__name__)

_EXPIRED_STATUS: Mapping[str, Any] = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
    "message": "the namespaces matching the resource's namespace_selector changed; relisting",
}


def _meta(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


class NamespaceLabels:
    """The labels of every namespace, kept by one watch (a reflector over ``namespaces`` into this
    object, which is its store). :meth:`subscribe` is told of every change."""

    def __init__(self, *, lister_watcher: ListerWatcher, clock: Clock) -> None:
        self._labels: dict[str, dict[str, str]] = {}
        self._objects: dict[str, KubeObject] = {}
        self._listeners: list[Callable[[], None]] = []
        self._synced = asyncio.Event()
        self._reflector = Reflector(name="namespaces (namespace_selector)", lister_watcher=lister_watcher,
                                    store=self, clock=clock, page_size=500)
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle

    async def start(self, timeout: float | None = None) -> None:
        """Starts the watch and returns once the first list is in (``timeout`` seconds at most:
        :class:`TimeoutError`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._reflector.run(), name="namespace-labels")
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    async def stop(self) -> None:
        self._reflector.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """``listener()`` is called (synchronously) after any namespace's labels changed."""
        self._listeners.append(listener)

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels; None when it does not exist (or is not known yet)."""
        return self._labels.get(namespace)

    def names(self) -> builtins.list[str]:
        return sorted(self._labels)

    # -- the reflector's store

    def _set(self, obj: KubeObject) -> bool:
        meta = _meta(obj)
        name = str(meta.get("name") or "")
        raw = meta.get("labels")
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        self._objects[name] = obj
        changed = self._labels.get(name) != labels
        self._labels[name] = labels
        return changed

    def _changed(self) -> None:
        if not self._synced.is_set():
            return
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # one scope's failure must not stop the others from hearing
                log.exception("namespace label listener failed")

    def add(self, obj: KubeObject) -> None:
        if self._set(obj):
            self._changed()

    def update(self, obj: KubeObject) -> None:
        self.add(obj)

    def delete(self, obj: KubeObject | DeletedFinalStateUnknown) -> None:
        target = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        name = str(_meta(target).get("name") or "")
        self._objects.pop(name, None)
        if self._labels.pop(name, None) is not None:
            self._changed()

    def replace(self, items: Sequence[KubeObject], resource_version: str) -> None:
        before = dict(self._labels)
        self._labels.clear()
        self._objects.clear()
        for item in items:
            self._set(item)
        if not self._synced.is_set():
            self._synced.set()
            log.info("namespace labels synced: %d namespaces", len(self._labels))
        elif before != self._labels:
            self._changed()

    def list(self) -> builtins.list[KubeObject]:
        return builtins.list(self._objects.values())

    def list_keys(self) -> builtins.list[ObjectKey]:
        return [ObjectKey(name) for name in sorted(self._objects)]

    def get(self, obj: KubeObject) -> KubeObject | None:
        return self._objects.get(str(_meta(obj).get("name") or ""))

    def get_by_key(self, key: ObjectKey) -> KubeObject | None:
        return self._objects.get(key)

    def resync(self) -> None:
        return None


class NamespaceScope:
    """The namespaces one ``namespace_selector`` matches, kept current from :class:`NamespaceLabels`.
    Its :attr:`generation` goes up whenever that set changes, which ends the open watches of the
    resources it scopes (:class:`NamespaceFilteredListerWatcher`)."""

    def __init__(self, *, selector: str, labels: NamespaceLabels) -> None:
        self.selector_text = selector
        self._selector: LabelSelector = parse_label_selector(selector)
        self._labels = labels
        self._matching = self._compute()
        self.generation = 0
        self._changed = asyncio.Event()
        labels.subscribe(self._on_labels)

    def __repr__(self) -> str:
        return f"NamespaceScope({self.selector_text!r}: {len(self._matching)} namespaces)"

    def _compute(self) -> frozenset[str]:
        return frozenset(n for n in self._labels.names()
                         if self._selector.matches(self._labels.labels(n) or {}))

    def _on_labels(self) -> None:
        matching = self._compute()
        if matching == self._matching:
            return
        entered, left = sorted(matching - self._matching), sorted(self._matching - matching)
        self._matching = matching
        self.generation += 1
        log.info("namespace_selector %r: namespaces %s now match, %s no longer; relisting the "
                 "resources it scopes", self.selector_text, entered or "none", left or "none")
        self._changed.set()
        self._changed = asyncio.Event()

    def matches(self, namespace: str) -> bool:
        return namespace in self._matching

    @property
    def namespaces(self) -> frozenset[str]:
        return self._matching

    async def wait_changed(self, generation: int) -> None:
        """Returns once :attr:`generation` differs from ``generation``."""
        while self.generation == generation:
            await self._changed.wait()


async def _next(source: AsyncIterator[Any]) -> Any:
    return await anext(source)


def _bookmark(resource_version: str) -> WatchEvent:
    obj: KubeObject = {"metadata": {"resourceVersion": resource_version}}
    return WatchEvent(type=WatchEventType.BOOKMARK, object=obj)


class _FilteredStream:
    """A watch stream with the events of other namespaces turned into bookmarks, ended by an
    ``ERROR`` 410 event when the scope's namespaces change."""

    def __init__(self, *, inner: WatchStream, scope: NamespaceScope, generation: int) -> None:
        self._inner = inner
        self._scope = scope
        self._generation = generation
        self.dropped = 0

    def _filter(self, events: Sequence[WatchEvent]) -> builtins.list[WatchEvent]:
        out: builtins.list[WatchEvent] = []
        for event in events:
            if event.type in (WatchEventType.BOOKMARK, WatchEventType.ERROR):
                out.append(event)
                continue
            meta = _meta(event.object)
            if self._scope.matches(str(meta.get("namespace") or "")):
                out.append(event)
            else:
                self.dropped += 1
                out.append(_bookmark(str(meta.get("resourceVersion") or "")))
        return out

    async def batches(self) -> AsyncIterator[builtins.list[WatchEvent]]:
        batches_of = getattr(self._inner, "batches", None)
        source: AsyncIterator[Any] = batches_of() if batches_of is not None else aiter(self._inner)
        batched = batches_of is not None
        changed = asyncio.create_task(self._scope.wait_changed(self._generation), name="namespace-scope")
        step: asyncio.Task[Any] | None = None
        try:
            while True:
                if self._scope.generation != self._generation:
                    yield [WatchEvent(type=WatchEventType.ERROR, object=dict(_EXPIRED_STATUS))]
                    return
                step = asyncio.create_task(_next(source), name="namespace-filtered-next")
                await asyncio.wait({step, changed}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                        await step
                    continue  # the scope changed: the loop's first check ends the stream
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                events = item if batched else [item]
                yield self._filter(events)
        finally:
            changed.cancel()
            if step is not None and not step.done():
                # The consumer left while the next event was awaited (cancelled, or closed): that
                # wait ends with it, so neither it nor the inner stream's end outlives the stream.
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                    await step
            with contextlib.suppress(Exception):
                closer = getattr(source, "aclose", None)
                if closer is not None:
                    await closer()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        async for batch in self.batches():
            for event in batch:
                yield event

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def close(self) -> None:
        await self._inner.close()


class NamespaceFilteredListerWatcher:
    """Wraps a cluster-wide :class:`~bridge.contracts.ListerWatcher`: lists and watches keep only the
    objects of the namespaces ``scope`` matches (see the module docs)."""

    def __init__(self, *, inner: ListerWatcher, scope: NamespaceScope) -> None:
        self._inner = inner
        self._scope = scope
        self.dropped = 0
        """List items and watch events of namespaces out of scope."""
        self._listed_generation: int | None = None
        """The scope's generation when the last list began: a watch opened after the scope changed
        since then ends at once, so that the change is never missed between a list and its watch.
        None before any list of this process: the first watch (resuming from a checkpoint written
        while the namespaces may have been relabelled) then ends at once too, and the reflector
        lists."""

    @property
    def inner(self) -> ListerWatcher:
        """The wrapped lister-watcher (its own counters and settings, for tools and tests)."""
        return self._inner

    async def list(self, options: ListOptions) -> ListPage:
        if not options.continue_token:
            self._listed_generation = self._scope.generation
        page = await self._inner.list(options)
        kept = [o for o in page.items if self._scope.matches(str(_meta(o).get("namespace") or ""))]
        self.dropped += len(page.items) - len(kept)
        if len(kept) == len(page.items):
            return page
        return ListPage(items=kept, resource_version=page.resource_version,
                        continue_token=page.continue_token, remaining_item_count=None)

    async def watch(self, options: WatchOptions) -> WatchStream:
        generation = -1 if self._listed_generation is None else self._listed_generation
        if options.send_initial_events:
            generation = self._scope.generation  # a WatchList lists, filtered by the set of now
            self._listed_generation = generation
        inner = await self._inner.watch(options)
        return _FilteredStream(inner=inner, scope=self._scope, generation=generation)
