"""Per-sink filters: which events a sink wants (routing) and which updates are noise (change filter).

Routing matches the resource, the namespace (include / exclude), a label selector and the event
type. The change filter looks at what an update really changed: an update whose only differences lie
under ignored paths (``metadata.resourceVersion``, ``metadata.managedFields`` by default) is noise
and is filtered out; with ``only_paths``, only updates touching one of those paths are kept.

The label selector is the project's one implementation, :mod:`bridge.labels` (apimachinery's
grammar, validation and messages, in the foundations the sinks may use): a selector the bridge
accepts for a sink is one the API server would accept, and matches the same objects.

Paths are dotted (``spec.template.spec``); a key containing dots is quoted in brackets
(``metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]``), and ``*`` matches
every key of a mapping or item of a list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from bridge.labels import parse_label_selector
from bridge.rawobject import RawObject
from sinks.contract import ChangeEvent, EventType
from sinks.event_routing import EventRoute

__all__ = [
    "WILDCARD",
    "ChangeFilter",
    "Path",
    "RoutingFilter",
    "changed_paths",
    "is_mapping",
    "parse_path",
    "resource_matches",
]

WILDCARD = "*"
Path = tuple[str, ...]

_PATH_TOKEN = re.compile(r"""\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[\s*'([^']*)'\s*\]|([^.\[\]]+)""")


def parse_path(text: str) -> Path:
    """``a.b["c.d"].*`` → ``("a", "b", "c.d", "*")``; raises ValueError when malformed."""
    if not text or not text.strip():
        raise ValueError("empty path")
    parts: list[str] = []
    pos = 0
    expect_token = True
    while pos < len(text):
        if not expect_token:
            if text[pos] == ".":
                pos += 1
                expect_token = True
                continue
            if text[pos] != "[":
                raise ValueError(f"malformed path {text!r} at offset {pos}")
        match = _PATH_TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"malformed path {text!r} at offset {pos}")
        dq, sq, bare = match.groups()
        if dq is not None:
            parts.append(re.sub(r"\\(.)", r"\1", dq))
        elif sq is not None:
            parts.append(sq)
        else:
            parts.append(bare.strip())
        pos = match.end()
        expect_token = False
    if expect_token:
        raise ValueError(f"malformed path {text!r}: ends with '.'")
    return tuple(parts)


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None), list})


def is_mapping(value: Any) -> bool:
    """``isinstance(value, Mapping)`` without the ABC check for the JSON types seen on hot paths."""
    kind = type(value)
    if kind is dict:
        return True
    if kind in _SCALARS:
        return False
    return isinstance(value, Mapping)


def changed_paths(old: Any, new: Any, base: Path = ()) -> Iterator[Path]:
    """Yields the paths where ``old`` and ``new`` differ, descending into mappings present on both
    sides (lists are compared whole). Lazy, so a caller can stop at the first interesting change."""
    if is_mapping(old) and is_mapping(new):
        for key, value in new.items():
            if key not in old:
                yield (*base, str(key))
            else:
                other = old[key]
                if other is value:
                    continue
                yield from changed_paths(other, value, (*base, str(key)))
        for key in old:
            if key not in new:
                yield (*base, str(key))
    elif old != new:
        yield base


# The ignored paths as a trie: key → child node; _IGNORED marks an ignored subtree.
_Trie = dict[str, Any]
_IGNORED: _Trie = {}
_MISSING: Any = object()


def _build_trie(paths: Iterable[Path]) -> _Trie | None:
    root: _Trie = {}
    for path in paths:
        node = root
        for seg in path[:-1]:
            nxt = node.get(seg)
            if nxt is _IGNORED:
                break
            if nxt is None:
                nxt = node[seg] = {}
            node = nxt
        else:
            node[path[-1]] = _IGNORED
    return root or None


def _child(node: _Trie | None, key: str) -> _Trie | None:
    if node is None:
        return None
    found = node.get(key)
    return found if found is not None else node.get(WILDCARD)


def _differs(old: Any, new: Any, ignore: _Trie | None) -> bool:
    """True if ``old`` and ``new`` differ outside the ignored subtrees."""
    if ignore is _IGNORED or old is new:
        return False
    if ignore is None or not (is_mapping(old) and is_mapping(new)):
        return bool(old != new)  # deep comparison at C speed
    wild = ignore.get(WILDCARD)
    shared = 0
    for key, value in new.items():
        if key not in old:
            if ignore.get(key, wild) is _IGNORED:
                continue
            return True
        shared += 1
        before = old[key]
        if before is value:
            continue
        child = ignore.get(key, wild)
        if child is _IGNORED:
            continue
        if child is None:
            if before != value:
                return True
        elif _differs(before, value, child):
            return True
    if shared == len(old):
        return False  # every key of ``old`` is in ``new`` too
    return any(key not in new and ignore.get(key, wild) is not _IGNORED for key in old)


def _touches(old: Any, new: Any, path: Path, ignore: _Trie | None) -> bool:
    """True if the values at ``path`` (``*`` expanded) differ outside the ignored subtrees."""
    if old is new or ignore is _IGNORED:
        return False
    if not path:
        return _differs(old, new, ignore)
    head, rest = path[0], path[1:]
    old_map, new_map = is_mapping(old), is_mapping(new)
    if head != WILDCARD:
        return _touches(
            old.get(head, _MISSING) if old_map else _MISSING,
            new.get(head, _MISSING) if new_map else _MISSING,
            rest,
            _child(ignore, head),
        )
    if old_map or new_map:
        keys = dict.fromkeys([*(old if old_map else ()), *(new if new_map else ())])
        return any(
            _touches(
                old.get(k, _MISSING) if old_map else _MISSING,
                new.get(k, _MISSING) if new_map else _MISSING,
                rest,
                _child(ignore, k),
            )
            for k in keys
        )
    old_list = old if isinstance(old, list) else []
    new_list = new if isinstance(new, list) else []
    return any(
        _touches(
            old_list[i] if i < len(old_list) else _MISSING,
            new_list[i] if i < len(new_list) else _MISSING,
            rest,
            ignore,
        )
        for i in range(max(len(old_list), len(new_list)))
    )


_RV_PATH: Path = ("metadata", "resourceVersion")
_MF_PATH: Path = ("metadata", "managedFields")


class ChangeFilter:
    """Decides whether an update is worth delivering."""

    __slots__ = ("_active", "_bytes_compare", "_rv_ignored", "_trie", "ignore", "only")

    def __init__(self, *, ignore_paths: Iterable[str] = (), only_paths: Iterable[str] = ()) -> None:
        self.ignore: tuple[Path, ...] = tuple(parse_path(p) for p in ignore_paths)
        self.only: tuple[Path, ...] = tuple(parse_path(p) for p in only_paths)
        self._trie = _build_trie(self.ignore)
        # Objects kept as bytes are compared as bytes when nothing but the resourceVersion and
        # managedFields is ignored (the default): a decode of both objects saved per update.
        ignored = set(self.ignore)
        self._bytes_compare = not self.only and ignored <= {_RV_PATH, _MF_PATH}
        self._rv_ignored = _RV_PATH in ignored
        self._active = bool(self.ignore or self.only)

    @property
    def active(self) -> bool:
        return self._active

    def interesting(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
        """True if something differs between ``old`` and ``new`` outside the ignored paths and (when
        ``only_paths`` is set) under one of them. Without ``old`` every update is interesting."""
        if old is None or new is None or not self._active:
            return True
        if (
            self._bytes_compare
            and type(old) is RawObject
            and type(new) is RawObject
            and not (old.managed_fields or new.managed_fields)
        ):
            # Two objects without managedFields, as JSON bytes: do they differ, outside the
            # resourceVersion when it is ignored? Bytes that differ in layout only (never the case
            # for two states of one object from one API server) count as a change: a redundant
            # update, never a lost one. (Inline rather than a function: it runs for every update.)
            old_raw = old.raw
            new_raw = new.raw
            if old_raw == new_raw:
                return False
            old_rv = old.resource_version
            new_rv = new.resource_version
            if not (self._rv_ignored and old_rv and new_rv):
                return True
            # Equal once the first resourceVersion member is swapped: exactly that member changed,
            # and it is metadata's (any other one changing would leave metadata's unequal).
            return old_raw.replace(b'"resourceVersion":' + orjson.dumps(old_rv),
                                   b'"resourceVersion":' + orjson.dumps(new_rv), 1) != new_raw
        if not self.only:
            return _differs(old, new, self._trie)
        return any(_touches(old, new, path, self._trie) for path in self.only)


# ---- routing -----------------------------------------------------------------------------------


def resource_matches(pattern: str, group: str, resource: str) -> bool:
    """``pods`` matches the plural name in any group; ``deployments.apps`` matches exactly; ``*``
    matches everything. Names are case-insensitive."""
    pattern = pattern.strip().lower()
    if pattern == WILDCARD:
        return True
    name, _, pgroup = pattern.partition(".")
    if name != resource.lower():
        return False
    return not pgroup or pgroup == group.lower()


class RoutingFilter:
    """Which events a sink accepts. Snapshot markers carry no object, so only the resource and the
    event-type rules apply to them."""

    __slots__ = ("event_types", "events", "exclude_namespaces", "namespaces", "resources", "selector")

    def __init__(
        self,
        *,
        resources: Sequence[str] = (),
        namespaces: Sequence[str] = (),
        exclude_namespaces: Sequence[str] = (),
        label_selector: str = "",
        event_types: Sequence[str] = (),
        events: EventRoute | None = None,
    ) -> None:
        """``events``: rules on what Kubernetes Events say (:mod:`sinks.event_routing`)."""
        self.events = events if events is not None and not events.empty else None
        self.resources = tuple(r.strip().lower() for r in resources)
        self.namespaces = frozenset(namespaces)
        self.exclude_namespaces = frozenset(exclude_namespaces)
        self.selector = parse_label_selector(label_selector)
        self.event_types = frozenset(EventType(t) for t in event_types)

    @property
    def accepts_all(self) -> bool:
        """True when no rule is set: :meth:`accepts` is True for every event."""
        return not (self.event_types or self.resources or self.namespaces or self.exclude_namespaces
                    or self.events) and self.selector.empty

    def accepts(self, event: ChangeEvent) -> bool:
        if self.event_types and event.type not in self.event_types:
            return False
        res = event.resource
        if self.resources and not any(resource_matches(p, res.group, res.resource) for p in self.resources):
            return False
        if event.obj is None:
            return True
        if self.namespaces or self.exclude_namespaces:
            ns = event.namespace
            if self.namespaces and ns not in self.namespaces:
                return False
            if ns in self.exclude_namespaces:
                return False
        if not self.selector.empty:
            labels = event.metadata.get("labels")
            if not self.selector.matches(labels if isinstance(labels, Mapping) else None):
                return False
        return self.events is None or self.events.accepts(event)
