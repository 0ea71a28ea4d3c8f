"""``check-config --cluster``: what the configuration asks of the cluster, checked before deploying.

A valid file can still fail once deployed: a resource the API server does not serve (``podz``, a CRD
not installed) leaves ``run`` unready, and a missing RBAC rule answers every list with 403. Both are
known from the cluster in a few requests, so ``check-config --cluster`` asks them before the bridge
runs:

* every configured resource is resolved through discovery, as ``run`` resolves it (aliases, short
  names, kinds, custom resources), and must support ``list`` and ``watch``;
* for each, a SelfSubjectAccessReview asks whether the credentials the bridge will use may ``list``
  and ``watch`` it in the configured scope (a namespace, or all of them), and ``get`` when a label or
  field selector is set (a delete seen through a selector is told from a selector exit by reading the
  object, see :mod:`bridge.delivery.selector_exit`).

Every problem is collected (one request failing does not hide the others) and named with the
resource as configured, so one run lists all that needs fixing. The access review asks the API
server's authorizers themselves: it answers for RBAC, webhooks and any other authorizer alike,
without reading a single Role.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.errors import ApiError, ConfigurationError
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource, Discovery
from bridge.service.config import BridgeConfig, ResourceConfig

__all__ = ["ClusterProblem", "check_cluster"]

_REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclass(frozen=True, slots=True)
class ClusterProblem:
    """One thing the cluster will refuse, with where it comes from in the configuration."""

    field: str
    """The configuration field: ``resources.0``."""
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _verbs(r: ResourceConfig) -> tuple[str, ...]:
    """The verbs the bridge uses on a configured resource."""
    if r.label_selector or r.field_selector:
        return ("list", "watch", "get")
    return ("list", "watch")


async def _allowed(client: ApiClient, api: APIResource, verb: str, namespace: str) -> tuple[bool, str]:
    """The access review's answer: (allowed, the authorizer's reason or denial text)."""
    attributes: dict[str, str] = {"verb": verb, "group": api.group, "version": api.version,
                                  "resource": api.resource}
    if namespace and api.namespaced:
        attributes["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attributes}}
    answer = await client.create(_REVIEW_PATH, review,
                                 context=f"asking whether {verb} {api.qualified} is allowed")
    status = answer.get("status") if isinstance(answer.get("status"), dict) else {}
    assert isinstance(status, dict)
    why = str(status.get("evaluationError") or status.get("reason") or "")
    return bool(status.get("allowed")), why


async def check_cluster(config: BridgeConfig, client: ApiClient) -> list[ClusterProblem]:
    """Every problem the cluster behind ``client`` has with ``config``'s resources (empty: none)."""
    discovery = Discovery(client=client)
    problems: list[ClusterProblem] = []
    for i, r in enumerate(config.resources):
        field = f"resources.{i} ({r.resource!r})"
        try:
            api = await discovery.resolve(r.resource)
        except ConfigurationError as e:
            problems.append(ClusterProblem(field, str(e)))
            continue
        except ApiError as e:
            problems.append(ClusterProblem(field, f"discovery failed: {e}"))
            continue
        missing = [v for v in ("list", "watch") if v not in api.verbs]
        if missing:
            problems.append(ClusterProblem(
                field, f"{api.qualified} does not support {' and '.join(missing)} (its verbs: "
                       f"{', '.join(api.verbs) or 'none'}): the bridge cannot watch it"))
            continue
        scope = f"in the namespace {r.namespace!r}" if r.namespace and api.namespaced else (
            "in all namespaces" if api.namespaced else "at the cluster scope")
        denied: list[str] = []
        for verb in _verbs(r):
            try:
                allowed, why = await _allowed(client, api, verb, r.namespace)
            except ApiError as e:
                problems.append(ClusterProblem(field, f"cannot ask whether {verb} is allowed: {e}"))
                break
            if not allowed:
                denied.append(f"{verb}{f' ({why})' if why else ''}")
        if denied:
            rule = (f'apiGroups: ["{api.group}"], resources: ["{api.resource}"], '
                    f'verbs: [{", ".join(chr(34) + v + chr(34) for v in _verbs(r))}]')
            problems.append(ClusterProblem(
                field, f"the bridge's credentials may not {', '.join(denied)} {api.qualified} {scope}; "
                       f"grant a rule with {rule}"))
    return problems
