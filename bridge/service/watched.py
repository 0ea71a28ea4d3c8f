"""What the configuration asks to watch, as discovery resolves it: one
:class:`~bridge.delivery.assembly.WatchedResource` per ``resources`` entry.

Resolved at the start of every term (:mod:`bridge.service.term`). One entry that cannot be
resolved does not stop the others: it is reported and keeps the service unready (its reason, in
``unresolved``). What only discovery can reveal is a configuration error, raised as at start: two
entries naming one resource in one scope (a custom resource's aliases), a ``namespace_selector`` on
a cluster-scoped resource.
"""

from __future__ import annotations

import logging

from bridge.delivery.assembly import WatchedResource
from bridge.errors import ApiError, ConfigurationError
from bridge.informer.factory import InformerKey
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource, Discovery
from bridge.service.config import BridgeConfig
from sinks.contract import ResourceRef

__all__ = ["resolve_watched"]

log = logging.getLogger(__name__)


async def resolve_watched(config: BridgeConfig, client: ApiClient,
                          unresolved: dict[str, str]) -> list[WatchedResource]:
    """The configured resources discovery knows, in the configuration's order; each one it does not
    (or could not answer for) is logged and recorded in ``unresolved`` (resource → why)."""
    discovery = Discovery(client=client)
    watched: list[WatchedResource] = []
    # The configuration rejects aliases of one built-in resource; a custom resource's aliases
    # (widget, wdg, widgets.example.com) are known only once discovery has answered.
    seen: dict[tuple[str, str, str, str, str], int] = {}
    for i, r in enumerate(config.resources):
        try:
            api: APIResource = await discovery.resolve(r.resource)
        except ConfigurationError as e:
            # One bad resource must not stop the others: report it, keep it unready.
            log.error("cannot watch the resource: %s", e, extra={"resource": r.resource})
            unresolved[r.resource] = str(e)
            continue
        except ApiError as e:
            log.error("discovery failed: %s", e, extra={"resource": r.resource})
            unresolved[r.resource] = str(e)
            continue
        if r.namespace_selector and not api.namespaced:
            raise ConfigurationError(
                f"invalid configuration: resources.{i}.namespace_selector: {api.qualified} is "
                "cluster-scoped: its objects belong to no namespace")
        first = seen.setdefault((api.qualified, r.namespace, r.label_selector, r.field_selector,
                                 r.namespace_selector), i)
        if first != i:
            raise ConfigurationError(
                f"invalid configuration: resources.{first} ({config.resources[first].resource!r}) "
                f"and resources.{i} ({r.resource!r}) both name {api.qualified} in the same scope: "
                "every change would be sent twice; keep one of them")
        key = InformerKey(resource=r.resource, namespace=r.namespace,
                          label_selector=r.label_selector, field_selector=r.field_selector,
                          namespace_selector=r.namespace_selector)
        ref = ResourceRef(group=api.group, version=api.version, resource=api.resource,
                          kind=api.kind, namespaced=api.namespaced)
        watched.append(WatchedResource(key=key, api=api, ref=ref))
    return watched
