"""Resolving the resource names users write into API paths, through the server's discovery.

Users configure informers with the names kubectl accepts (``pods``, ``po``, ``Pod``,
``deployments.apps``, ``deployments.apps/v1``, ``deployments.v1.apps``, ``widgets.example.com/v1``). The
API server says what exists (``/api``, ``/apis``, and one resource list per group version); this module
reads that once, caches it, and answers :meth:`Discovery.resolve` from the cache, re-reading discovery
once when a name is not found (a CRD may have been installed since) and on :meth:`Discovery.invalidate`.

Errors name the resource and, for a typo, the closest names that do exist.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.errors import ApiError, ApiStatusError, ConfigurationError

__all__ = [
    "APIResource",
    "Discovery",
    "DiscoveryClient",
    "UnknownResourceError",
    "UnsupportedResourceError",
    "parse_resource_list",
]

_log = logging.getLogger(__name__)


class UnknownResourceError(ConfigurationError):
    """No resource of that name is served by the API server."""

    def __init__(self, message: str, *, name: str, suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.suggestions = suggestions


class UnsupportedResourceError(ConfigurationError):
    """The resource exists but does not support what the bridge needs (list and watch)."""


@dataclass(frozen=True, slots=True)
class APIResource:
    """One group/version/resource as discovery describes it."""

    group: str
    """"" for the core group."""
    version: str
    resource: str
    """The plural name used in paths (``pods``)."""
    kind: str
    namespaced: bool
    verbs: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    singular: str = ""

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise (an object's ``apiVersion``)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """kubectl's spelling: ``pods``, ``deployments.apps``."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def group_version_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None) -> str:
        """The collection path, scoped to ``namespace`` when given and the resource is namespaced
        (``/api/v1/namespaces/ns/pods``); all namespaces (or cluster-scoped) otherwise."""
        if namespace and self.namespaced:
            return f"{self.group_version_path}/namespaces/{namespace}/{self.resource}"
        return f"{self.group_version_path}/{self.resource}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        """The path of one object."""
        return f"{self.path(namespace)}/{name}"

    def supports(self, *verbs: str) -> bool:
        return all(v in self.verbs for v in verbs)

    def __str__(self) -> str:
        return f"{self.qualified}/{self.version}"


class DiscoveryClient(Protocol):
    """What discovery needs from the API client (:class:`bridge.apiclient.ApiClient` fits)."""

    async def get_json(self, path: str, params: Any = None, *, context: str = "") -> dict[str, Any]: ...


def parse_resource_list(body: dict[str, Any], *, group: str, version: str) -> list[APIResource]:
    """The resources of one ``APIResourceList``, subresources (``pods/status``) left out."""
    out: list[APIResource] = []
    for entry in body.get("resources") or []:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name") or "")
        if not name or "/" in name:
            continue
        out.append(
            APIResource(
                group=str(entry.get("group") or group),
                version=str(entry.get("version") or version),
                resource=name,
                kind=str(entry.get("kind") or ""),
                namespaced=bool(entry.get("namespaced", False)),
                verbs=tuple(str(v) for v in entry.get("verbs") or ()),
                short_names=tuple(str(s) for s in entry.get("shortNames") or ()),
                singular=str(entry.get("singularName") or ""),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class _Catalog:
    """Every served resource, in resolution priority order: core first, then groups as the server
    lists them, each group's preferred version first."""

    resources: tuple[APIResource, ...]
    groups: frozenset[str]
    versions: dict[str, tuple[str, ...]]
    """group → versions, preferred first."""


def _split_name(name: str) -> tuple[str, str | None]:
    """``deployments.apps/v1`` → (``deployments.apps``, ``v1``); ``pods`` → (``pods``, None)."""
    if "/" in name:
        head, _, version = name.partition("/")
        return head, version or None
    return name, None


class Discovery:
    """Cached API discovery. Safe to share between informers; concurrent loads are coalesced."""

    def __init__(self, *, client: DiscoveryClient) -> None:
        self._client = client
        self._catalog: _Catalog | None = None
        self._lock = asyncio.Lock()
        self.loads = 0
        """How many times discovery was read from the server."""

    def invalidate(self) -> None:
        """Forgets the cache; the next :meth:`resolve` reads discovery again (CRDs added since)."""
        self._catalog = None

    async def resources(self) -> list[APIResource]:
        """Every served resource (preferred versions first)."""
        return list((await self._load()).resources)

    async def _load(self, *, refresh: bool = False) -> _Catalog:
        current = self._catalog
        async with self._lock:
            if self._catalog is not None and not (refresh and self._catalog is current):
                return self._catalog
            self._catalog = await self._discover()
            self.loads += 1
            return self._catalog

    async def _group_version(self, path: str, group: str, version: str) -> list[APIResource]:
        try:
            body = await self._client.get_json(path, context=f"discovery {path}")
        except ApiStatusError as e:
            # One broken aggregated API (metrics.k8s.io down, forbidden) must not hide the others.
            _log.warning("discovery of %s failed (%s); skipping it", path, e)
            return []
        return parse_resource_list(body, group=group, version=version)

    async def _discover(self) -> _Catalog:
        core = await self._client.get_json("/api", context="discovery /api")
        groups_body = await self._client.get_json("/apis", context="discovery /apis")
        plan: list[tuple[str, str, str]] = [
            ("", str(v), f"/api/{v}") for v in core.get("versions") or ["v1"]
        ]
        versions: dict[str, tuple[str, ...]] = {"": tuple(str(v) for v in core.get("versions") or ["v1"])}
        for g in groups_body.get("groups") or []:
            gname = str(g.get("name") or "")
            if not gname:
                continue
            listed = [str(v.get("version")) for v in g.get("versions") or [] if v.get("version")]
            preferred = str((g.get("preferredVersion") or {}).get("version") or (listed[0] if listed else ""))
            ordered = ([preferred] if preferred else []) + [v for v in listed if v != preferred]
            versions[gname] = tuple(ordered)
            plan.extend((gname, v, f"/apis/{gname}/{v}") for v in ordered)
        lists = await asyncio.gather(*(self._group_version(p, g, v) for g, v, p in plan))
        resources = tuple(r for rl in lists for r in rl)
        return _Catalog(resources=resources, groups=frozenset(versions), versions=versions)

    @staticmethod
    def _match(catalog: _Catalog, name: str) -> list[APIResource]:
        base, version = _split_name(name.strip())
        lowered = base.lower()
        candidates: list[APIResource] = []
        # resource.group / resource.version.group, when the suffix is a served group.
        if "." in lowered:
            head, _, rest = lowered.partition(".")
            group, group_version = rest, version
            if rest not in catalog.groups and "." in rest:
                maybe_version, _, maybe_group = rest.partition(".")
                if maybe_group in catalog.groups and maybe_version in catalog.versions[maybe_group]:
                    group, group_version = maybe_group, maybe_version
            if group in catalog.groups:
                candidates = [
                    r
                    for r in catalog.resources
                    if r.group == group
                    and (group_version is None or r.version == group_version)
                    and head in (r.resource, r.singular, r.kind.lower(), *r.short_names)
                ]
                if candidates:
                    return candidates
        for matcher in (
            lambda r: r.resource == lowered,
            lambda r: (r.singular or r.kind.lower()) == lowered,
            lambda r: lowered in r.short_names,
            lambda r: r.kind.lower() == lowered,
        ):
            found = [r for r in catalog.resources if matcher(r) and (version is None or r.version == version)]
            if found:
                return found
        return []

    async def resolve(self, name: str) -> APIResource:
        """The resource ``name`` designates, in its preferred version unless one is given.

        Raises :class:`UnknownResourceError` (with close names) when nothing matches, after reading
        discovery afresh once."""
        if not name or not name.strip():
            raise UnknownResourceError("empty resource name", name=name)
        try:
            catalog = await self._load()
            found = self._match(catalog, name)
            if not found:
                catalog = await self._load(refresh=True)
                found = self._match(catalog, name)
        except ApiError as e:
            raise type(e)(f"resolving resource {name!r}: {e}", **_status_kwargs(e)) from e
        if not found:
            known = sorted(
                {r.resource for r in catalog.resources}
                | {r.qualified for r in catalog.resources}
                | {s for r in catalog.resources for s in r.short_names}
            )
            base, _ = _split_name(name.strip())
            close = tuple(difflib.get_close_matches(base.lower(), known, n=3, cutoff=0.6))
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownResourceError(
                f"unknown resource {name!r}: the API server serves no such resource (check the name, "
                f"or install its CRD){hint}",
                name=name,
                suggestions=close,
            )
        # Same name in several groups (events vs events.events.k8s.io): core / first listed wins,
        # as in kubectl. Within a group, versions are already in preference order.
        return found[0]


def _status_kwargs(e: ApiError) -> dict[str, Any]:
    if isinstance(e, ApiStatusError):
        return {"code": e.code, "reason": e.reason, "retry_after": e.retry_after, "status": e.status}
    return {}
