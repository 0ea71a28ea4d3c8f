"""The resource types the simulator serves, and how their names resolve.

kube-apiserver answers discovery from the set of installed types; the simulator keeps the same set in a
:class:`ResourceRegistry` that starts with the core types the bridge watches in practice and grows when a
CRD is registered (at start or at run time). Both the HTTP layer and the Python API of the store resolve
resource names through it (``pods``, ``deployments.apps``, ``widgets.example.com``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BUILTIN_RESOURCES", "ResourceRegistry", "ResourceType", "UnknownResourceError"]

_ALL_VERBS: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update",
                               "watch")


class UnknownResourceError(KeyError):
    """No registered resource type matches the given name."""


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One group/version/resource as discovery describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _ALL_VERBS
    has_status: bool = True
    """Whether ``<plural>/status`` exists; status changes never bump ``metadata.generation``."""
    crd: bool = False
    """Served from a CRD: list items keep their apiVersion/kind (built-in types' list items carry
    neither on the wire, as kube-apiserver encodes them)."""
    categories: tuple[str, ...] = ()
    """Discovery categories (``all`` is what ``kubectl get all`` lists)."""
    scalable: bool = False
    """Whether ``<plural>/scale`` (an ``autoscaling/v1`` Scale of ``spec.replicas``) exists."""
    generation: bool = True
    """Whether objects carry ``metadata.generation`` (kinds with a spec; not ConfigMaps, Secrets…)."""
    virtual: bool = False
    """Create-only and never stored (SelfSubjectAccessReview): the server answers it itself."""
    schema: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    """A CRD's ``openAPIV3Schema`` (None: any object)."""
    field_selectors: tuple[str, ...] = ()
    """Field paths a field selector may use besides ``metadata.name`` and ``metadata.namespace``."""

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` for the core group, ``deployments.apps`` otherwise (kubectl's spelling)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    def discovery_entries(self) -> list[dict[str, Any]]:
        """The APIResource entries for this type (and its status subresource)."""
        main: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular_name,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        entries = [main]
        if self.scalable:
            entries.append({
                "name": f"{self.plural}/scale",
                "singularName": "",
                "namespaced": self.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            })
        if self.has_status:
            entries.append({
                "name": f"{self.plural}/status",
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            })
        return entries

    def aggregated_entry(self) -> dict[str, Any]:
        """This type as an ``apidiscovery.k8s.io/v2`` APIResourceDiscovery (aggregated discovery)."""
        entry: dict[str, Any] = {
            "resource": self.plural,
            "responseKind": {"group": self.group, "version": self.version, "kind": self.kind},
            "scope": "Namespaced" if self.namespaced else "Cluster",
            "singularResource": self.singular_name,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        subresources: list[dict[str, Any]] = []
        if self.scalable:
            subresources.append({"subresource": "scale", "verbs": ["get", "patch", "update"],
                                 "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}})
        if self.has_status:
            subresources.append({"subresource": "status", "verbs": ["get", "patch", "update"],
                                 "responseKind": {"group": self.group, "version": self.version,
                                                  "kind": self.kind}})
        if subresources:
            entry["subresources"] = subresources
        return entry

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> ResourceType:
        """Builds a CRD type from ``{group, version, plural, kind, namespaced?, singular?, shortNames?,
        categories?, schema?}`` (``schema``: the version's ``openAPIV3Schema``)."""
        try:
            group = str(spec["group"])
            version = str(spec["version"])
            plural = str(spec["plural"])
            kind = str(spec["kind"])
        except KeyError as exc:
            raise ValueError(f"a CRD needs group, version, plural and kind; {exc.args[0]!r} is missing") \
                from exc
        if not group or not version or not plural or not kind:
            raise ValueError("a CRD needs non-empty group, version, plural and kind")
        short = spec.get("shortNames") or spec.get("short_names") or ()
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, Mapping):
            raise ValueError("a CRD's schema must be an object (its openAPIV3Schema)")
        categories = spec.get("categories") or ()
        return cls(
            group=group,
            version=version,
            plural=plural,
            kind=kind,
            namespaced=bool(spec.get("namespaced", True)),
            singular=str(spec.get("singular") or ""),
            short_names=tuple(str(s) for s in short),
            crd=True,
            categories=tuple(str(c) for c in categories),
            schema=schema,
        )


_POD_FIELDS = ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
               "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
               "status.nominatedNodeName")
_EVENT_FIELDS = ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                 "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                 "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type")

BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(group="", version="v1", plural="pods", kind="Pod", short_names=("po",), categories=("all",),
                 field_selectors=_POD_FIELDS),
    ResourceType(group="", version="v1", plural="configmaps", kind="ConfigMap", short_names=("cm",),
                 has_status=False, generation=False),
    ResourceType(group="", version="v1", plural="secrets", kind="Secret", has_status=False, generation=False,
                 field_selectors=("type",)),
    ResourceType(group="", version="v1", plural="services", kind="Service", short_names=("svc",),
                 categories=("all",)),
    ResourceType(group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False,
                 short_names=("ns",), field_selectors=("status.phase",)),
    ResourceType(group="", version="v1", plural="events", kind="Event", short_names=("ev",),
                 has_status=False, generation=False, field_selectors=_EVENT_FIELDS),
    ResourceType(group="", version="v1", plural="nodes", kind="Node", namespaced=False, short_names=("no",),
                 field_selectors=("spec.unschedulable",)),
    ResourceType(group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", has_status=False),
    ResourceType(group="apps", version="v1", plural="deployments", kind="Deployment",
                 short_names=("deploy",), categories=("all",), scalable=True),
    ResourceType(group="apps", version="v1", plural="replicasets", kind="ReplicaSet", short_names=("rs",),
                 categories=("all",), scalable=True, field_selectors=("status.replicas",)),
    ResourceType(group="apps", version="v1", plural="statefulsets", kind="StatefulSet", short_names=("sts",),
                 categories=("all",), scalable=True),
    ResourceType(group="events.k8s.io", version="v1", plural="events", kind="Event", has_status=False,
                 generation=False),
    ResourceType(group="authorization.k8s.io", version="v1", plural="selfsubjectaccessreviews",
                 kind="SelfSubjectAccessReview", namespaced=False, verbs=("create",), has_status=False,
                 virtual=True),
)


@dataclass(slots=True)
class ResourceRegistry:
    """The served types, in registration order; lookups by name, kind, short name or path."""

    _types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)

    @classmethod
    def with_builtins(cls, extra: Iterable[ResourceType] = ()) -> ResourceRegistry:
        reg = cls()
        for rt in (*BUILTIN_RESOURCES, *extra):
            reg.register(rt)
        return reg

    def register(self, rt: ResourceType) -> ResourceType:
        """Adds a type; registering the same group/version/plural again replaces it."""
        self._types[(rt.group, rt.version, rt.plural)] = rt
        return rt

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The type served at ``/api[s]/<group>/<version>/<plural>``, or None."""
        return self._types.get((group, version, plural))

    def groups(self) -> dict[str, list[str]]:
        """Non-core group → versions, in registration order."""
        out: dict[str, list[str]] = {}
        for rt in self._types.values():
            if rt.group:
                versions = out.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self._types.values() if rt.group == group and rt.version == version]

    def resolve(self, name: str | ResourceType) -> ResourceType:
        """Finds a type from ``pods``, ``po``, ``Pod``, ``deployments.apps`` or ``widgets.example.com/v1``."""
        if isinstance(name, ResourceType):
            found = self._types.get((name.group, name.version, name.plural))
            if found is None:
                raise UnknownResourceError(f"resource {name.qualified} is not registered")
            return found
        text = name.strip()
        version = ""
        if "/" in text:
            text, _, version = text.partition("/")
        plural, _, group = text.partition(".")
        for rt in self._types.values():
            if rt.group != group or (version and rt.version != version):
                continue
            if plural in (rt.plural, rt.singular_name, rt.kind) or plural in rt.short_names:
                return rt
        raise UnknownResourceError(f"the server doesn't have a resource type {name!r}")
