"""Resolving the resource names users write into API paths, through the server's discovery.

Users configure informers with the names kubectl accepts (``pods``, ``po``, ``Pod``,
``deployments.apps``, ``deployments.apps/v1``, ``deployments.v1.apps``, ``widgets.example.com/v1``). The
API server says what exists; this module reads that once, caches it, and answers
:meth:`Discovery.resolve` from the cache, re-reading discovery once when a name is not found (a CRD may
have been installed since) and on :meth:`Discovery.invalidate`.

As client-go's discovery client, it asks for *aggregated discovery* first: ``/api`` and ``/apis`` are
requested with the ``Accept`` header client-go sends (``apidiscovery.k8s.io`` v2, then v2beta1, then
plain JSON), and a server that supports it (Kubernetes 1.27+) answers each with an
``APIGroupDiscoveryList`` holding every group, version and resource: two requests for the whole
cluster. A server that answers plain JSON (``APIVersions`` / ``APIGroupList``) gets the legacy walk:
one ``APIResourceList`` request per group version. Each of the two documents is judged on its own
``Content-Type``, as client-go does. Group versions an aggregated answer marks ``Stale`` (an aggregated
API server that is down) are skipped with a warning, like a group version whose legacy document fails.

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
    "ACCEPT_DISCOVERY",
    "APIResource",
    "Discovery",
    "DiscoveryClient",
    "UnknownResourceError",
    "UnsupportedResourceError",
    "parse_aggregated_discovery",
    "parse_resource_list",
]

ACCEPT_DISCOVERY = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json"
)
"""The ``Accept`` header of client-go's discovery requests: aggregated discovery first."""

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
    """What discovery needs from the API client (:class:`bridge.apiclient.ApiClient` fits). A client
    that also has ``get_negotiated(path, *, accept, context) -> (body, content_type)`` (as
    ``ApiClient`` does) gets aggregated discovery; one without it, the legacy documents."""

    async def get_json(self, path: str, params: Any = None, *, context: str = "") -> dict[str, Any]: ...


def _is_aggregated(content_type: str) -> bool:
    """Whether an answer's Content-Type is an ``APIGroupDiscoveryList`` (v2 or v2beta1), whatever the
    order of its parameters."""
    media, *params = (p.strip() for p in content_type.split(";"))
    if media.lower() != "application/json":
        return False
    found = dict(p.split("=", 1) for p in params if "=" in p)
    return (found.get("g") == "apidiscovery.k8s.io" and found.get("as") == "APIGroupDiscoveryList"
            and found.get("v") in ("v2", "v2beta1"))


def parse_aggregated_discovery(
    body: dict[str, Any],
) -> tuple[list[tuple[str, tuple[str, ...]]], list[APIResource], list[str]]:
    """An ``APIGroupDiscoveryList``: ``(groups with their versions in preference order, resources in
    the same order, stale group versions)``. Subresources and resources without a
    ``responseKind`` are left out (client-go counts the latter as failed)."""
    groups: list[tuple[str, tuple[str, ...]]] = []
    resources: list[APIResource] = []
    stale: list[str] = []
    for item in body.get("items") or []:
        if not isinstance(item, dict):
            continue
        group = str((item.get("metadata") or {}).get("name") or "")
        versions: list[str] = []
        for v in item.get("versions") or []:
            if not isinstance(v, dict) or not v.get("version"):
                continue
            version = str(v["version"])
            gv = f"{group}/{version}" if group else version
            if v.get("freshness") == "Stale":
                stale.append(gv)
                continue
            versions.append(version)
            for r in v.get("resources") or []:
                if not isinstance(r, dict) or not r.get("resource") or "/" in str(r["resource"]):
                    continue
                kind = (r.get("responseKind") or {}).get("kind") if isinstance(r.get("responseKind"), dict) \
                    else None
                if not kind:
                    _log.warning("discovery: resource %s of %s has no responseKind; skipping it",
                                 r["resource"], gv)
                    continue
                resources.append(APIResource(
                    group=group,
                    version=version,
                    resource=str(r["resource"]),
                    kind=str(kind),
                    namespaced=r.get("scope") == "Namespaced",
                    verbs=tuple(str(x) for x in r.get("verbs") or ()),
                    short_names=tuple(str(x) for x in r.get("shortNames") or ()),
                    singular=str(r.get("singularResource") or ""),
                ))
        groups.append((group, tuple(versions)))
    return groups, resources, stale


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

    async def _get(self, path: str) -> tuple[dict[str, Any], bool]:
        """``path``'s discovery document, and whether it is an aggregated one."""
        negotiate = getattr(self._client, "get_negotiated", None)
        if negotiate is None:
            return await self._client.get_json(path, context=f"discovery {path}"), False
        body, content_type = await negotiate(path, accept=ACCEPT_DISCOVERY, context=f"discovery {path}")
        return body, _is_aggregated(str(content_type))

    async def _discover(self) -> _Catalog:
        core, core_aggregated = await self._get("/api")
        groups_body, groups_aggregated = await self._get("/apis")
        # In server order, core first: (group, version, the legacy document's path or None when the
        # aggregated answer already holds its resources).
        plan: list[tuple[str, str, str | None]] = []
        versions: dict[str, tuple[str, ...]] = {}
        aggregated: dict[tuple[str, str], list[APIResource]] = {}
        for body, is_aggregated, legacy in ((core, core_aggregated, self._legacy_core),
                                            (groups_body, groups_aggregated, self._legacy_groups)):
            if is_aggregated:
                groups, resources, stale = parse_aggregated_discovery(body)
                for gv in stale:
                    _log.warning("discovery of %s: the server marks it stale (its API server is "
                                 "unavailable?); skipping it", gv)
                for r in resources:
                    aggregated.setdefault((r.group, r.version), []).append(r)
                for group, vs in groups:
                    versions[group] = vs
                    plan.extend((group, v, None) for v in vs)
            else:
                for group, vs in legacy(body):
                    versions[group] = vs
                    prefix = f"/apis/{group}" if group else "/api"
                    plan.extend((group, v, f"{prefix}/{v}") for v in vs)
        lists = await asyncio.gather(*(
            self._group_version(p, g, v) if p is not None else _ready(aggregated.get((g, v), []))
            for g, v, p in plan))
        resources_all = tuple(r for rl in lists for r in rl)
        return _Catalog(resources=resources_all, groups=frozenset(versions), versions=versions)

    @staticmethod
    def _legacy_core(core: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
        """An ``APIVersions`` document: the core group's versions."""
        return [("", tuple(str(v) for v in core.get("versions") or ["v1"]))]

    @staticmethod
    def _legacy_groups(groups_body: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
        """An ``APIGroupList``: each group's versions, the preferred one first."""
        out: list[tuple[str, tuple[str, ...]]] = []
        for g in groups_body.get("groups") or []:
            gname = str(g.get("name") or "")
            if not gname:
                continue
            listed = [str(v.get("version")) for v in g.get("versions") or [] if v.get("version")]
            preferred = str((g.get("preferredVersion") or {}).get("version") or (listed[0] if listed else ""))
            ordered = ([preferred] if preferred else []) + [v for v in listed if v != preferred]
            out.append((gname, tuple(ordered)))
        return out

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


async def _ready(resources: list[APIResource]) -> list[APIResource]:
    return resources


def _status_kwargs(e: ApiError) -> dict[str, Any]:
    if isinstance(e, ApiStatusError):
        return {"code": e.code, "reason": e.reason, "retry_after": e.retry_after, "status": e.status}
    return {}
