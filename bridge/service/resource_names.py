"""The built-in Kubernetes resources and every name kubectl accepts for them, known without a cluster.

The bridge resolves resource names through the API server's discovery at run time (see
:mod:`bridge.kube.discovery`). Two things need an answer earlier, with no cluster at hand:

* ``check-config`` (and ``run`` before it connects) must see that ``deploy``, ``Deployment`` and
  ``deployments.apps`` name one resource: two entries for it would start two informers and send
  every change twice;
* the Helm chart renders RBAC rules, which need the plural and the API group (a rule for a resource
  named ``deploy`` grants nothing). The chart's ``_builtin_resources.tpl`` is generated from
  :data:`BUILTIN_RESOURCES` by ``scripts/gen-chart-schema``.

The table lists the list/watch-able resources a Kubernetes 1.30 API server serves. Custom resources
are not in it: they are recognised by their ``<plural>.<group>`` spelling only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUILTIN_RESOURCES", "BuiltinResource", "canonical_resource", "resolve_builtin"]


@dataclass(frozen=True, slots=True)
class BuiltinResource:
    group: str
    """"" for the core group."""
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        """kubectl's spelling, and the bridge's label value: ``pods``, ``deployments.apps``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        return self.kind.lower()


def _r(group: str, plural: str, kind: str, *short: str, namespaced: bool = True) -> BuiltinResource:
    return BuiltinResource(group=group, plural=plural, kind=kind, namespaced=namespaced, short_names=short)


BUILTIN_RESOURCES: tuple[BuiltinResource, ...] = (
    # Core first, then groups in the order kube-apiserver lists them: that order decides a bare
    # name served by two groups (``events``), as in kubectl.
    _r("", "configmaps", "ConfigMap", "cm"),
    _r("", "endpoints", "Endpoints", "ep"),
    _r("", "events", "Event", "ev"),
    _r("", "limitranges", "LimitRange", "limits"),
    _r("", "namespaces", "Namespace", "ns", namespaced=False),
    _r("", "nodes", "Node", "no", namespaced=False),
    _r("", "persistentvolumeclaims", "PersistentVolumeClaim", "pvc"),
    _r("", "persistentvolumes", "PersistentVolume", "pv", namespaced=False),
    _r("", "pods", "Pod", "po"),
    _r("", "podtemplates", "PodTemplate"),
    _r("", "replicationcontrollers", "ReplicationController", "rc"),
    _r("", "resourcequotas", "ResourceQuota", "quota"),
    _r("", "secrets", "Secret"),
    _r("", "serviceaccounts", "ServiceAccount", "sa"),
    _r("", "services", "Service", "svc"),
    _r("apiregistration.k8s.io", "apiservices", "APIService", namespaced=False),
    _r("apps", "controllerrevisions", "ControllerRevision"),
    _r("apps", "daemonsets", "DaemonSet", "ds"),
    _r("apps", "deployments", "Deployment", "deploy"),
    _r("apps", "replicasets", "ReplicaSet", "rs"),
    _r("apps", "statefulsets", "StatefulSet", "sts"),
    _r("events.k8s.io", "events", "Event", "ev"),
    _r("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler", "hpa"),
    _r("batch", "cronjobs", "CronJob", "cj"),
    _r("batch", "jobs", "Job"),
    _r("certificates.k8s.io", "certificatesigningrequests", "CertificateSigningRequest", "csr",
       namespaced=False),
    _r("networking.k8s.io", "ingressclasses", "IngressClass", namespaced=False),
    _r("networking.k8s.io", "ingresses", "Ingress", "ing"),
    _r("networking.k8s.io", "networkpolicies", "NetworkPolicy", "netpol"),
    _r("policy", "poddisruptionbudgets", "PodDisruptionBudget", "pdb"),
    _r("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    _r("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", namespaced=False),
    _r("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
    _r("rbac.authorization.k8s.io", "roles", "Role"),
    _r("storage.k8s.io", "csidrivers", "CSIDriver", namespaced=False),
    _r("storage.k8s.io", "csinodes", "CSINode", namespaced=False),
    _r("storage.k8s.io", "csistoragecapacities", "CSIStorageCapacity"),
    _r("storage.k8s.io", "storageclasses", "StorageClass", "sc", namespaced=False),
    _r("storage.k8s.io", "volumeattachments", "VolumeAttachment", namespaced=False),
    _r("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
       namespaced=False),
    _r("admissionregistration.k8s.io", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
       namespaced=False),
    _r("admissionregistration.k8s.io", "validatingadmissionpolicybindings",
       "ValidatingAdmissionPolicyBinding", namespaced=False),
    _r("admissionregistration.k8s.io", "validatingwebhookconfigurations",
       "ValidatingWebhookConfiguration", namespaced=False),
    _r("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", "crd", "crds",
       namespaced=False),
    _r("scheduling.k8s.io", "priorityclasses", "PriorityClass", "pc", namespaced=False),
    _r("coordination.k8s.io", "leases", "Lease"),
    _r("node.k8s.io", "runtimeclasses", "RuntimeClass", namespaced=False),
    _r("discovery.k8s.io", "endpointslices", "EndpointSlice"),
    _r("flowcontrol.apiserver.k8s.io", "flowschemas", "FlowSchema", namespaced=False),
    _r("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", "PriorityLevelConfiguration",
       namespaced=False),
)

_GROUPS = frozenset(r.group for r in BUILTIN_RESOURCES)


def _names(r: BuiltinResource) -> tuple[str, ...]:
    return (r.plural, r.singular, *r.short_names)


def resolve_builtin(name: str) -> BuiltinResource | None:
    """The built-in resource ``name`` designates (``deploy``, ``Deployment``, ``deployments.apps``,
    ``deployments.apps/v1``, ``deployments.v1.apps``), following discovery's order: plural, then
    singular, then short name, then kind; core before the other groups. None when it is not one."""
    base = name.strip().partition("/")[0].lower()
    if "." in base:
        head, _, group = base.partition(".")
        if group not in _GROUPS and "." in group:
            group = group.partition(".")[2]  # resource.version.group
        if group in _GROUPS:
            return next((r for r in BUILTIN_RESOURCES if r.group == group and head in _names(r)), None)
        return None
    for matches in (
        lambda r: r.plural == base,
        lambda r: r.singular == base,
        lambda r: base in r.short_names,
    ):
        found = next((r for r in BUILTIN_RESOURCES if matches(r)), None)
        if found is not None:
            return found
    return None


def canonical_resource(name: str) -> str:
    """One spelling per resource: ``plural.group`` for a built-in one; for any other, the name
    lowercased with its version removed (``widgets.v1.example.com`` and ``widgets.example.com/v1``
    both become ``widgets.example.com``). Two entries with the same canonical name watch the same
    resource."""
    builtin = resolve_builtin(name)
    if builtin is not None:
        return builtin.qualified
    base = name.strip().partition("/")[0].lower()
    head, _, rest = base.partition(".")
    parts = rest.split(".")
    if len(parts) > 2 and parts[0].startswith("v") and parts[0][1:2].isdigit():
        rest = ".".join(parts[1:])
    return f"{head}.{rest}" if rest else head
