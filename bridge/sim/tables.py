"""``meta.k8s.io/v1`` Table responses: what ``kubectl get`` prints, computed by the server.

kubectl asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the columns the
server chose (``-o wide`` adds those of priority 1). The columns follow kube-apiserver's printers for the
served kinds; any other kind (CRDs) gets Name and Age, as a CRD without printer columns does.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bridge.sim.resources import ResourceType

__all__ = ["accepts_table", "table"]

Obj = Mapping[str, Any]
Cell = Callable[[Obj], Any]
_Column = tuple[str, str, int, str, Cell]
"""name, type, priority, description, cell."""


def accepts_table(accept: str) -> bool:
    """Whether the Accept header asks for a Table (kubectl get's human-readable output)."""
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip()
                  for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") == "v1":
            return True
    return False


def _age(obj: Obj) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    try:
        created = calendar.timegm(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return "<unknown>"
    return human_duration(max(0.0, time.time() - created))


def human_duration(seconds: float) -> str:
    """kubectl's short ages: ``45s``, ``3m12s``, ``5h``, ``12d``."""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _get(obj: Obj, *path: str, default: Any = None) -> Any:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, Mapping):
            return default
        cur = cur.get(part)
    return default if cur is None else cur


def _pod_ready(obj: Obj) -> str:
    containers = _get(obj, "spec", "containers", default=[])
    statuses = _get(obj, "status", "containerStatuses", default=[])
    ready = sum(1 for s in statuses if isinstance(s, Mapping) and s.get("ready"))
    return f"{ready}/{len(containers)}"


def _pod_status(obj: Obj) -> str:
    if _get(obj, "metadata", "deletionTimestamp"):
        return "Terminating"
    reason = _get(obj, "status", "reason")
    if reason:
        return str(reason)
    for status in _get(obj, "status", "containerStatuses", default=[]):
        waiting = _get(status, "state", "waiting", "reason")
        if waiting:
            return str(waiting)
    return str(_get(obj, "status", "phase", default="Pending"))


def _restarts(obj: Obj) -> int:
    return sum(int(s.get("restartCount", 0)) for s in _get(obj, "status", "containerStatuses", default=[])
               if isinstance(s, Mapping))


def _containers(obj: Obj, field: str) -> str:
    containers = _get(obj, "spec", "template", "spec", "containers", default=[])
    return ",".join(str(c.get(field, "")) for c in containers if isinstance(c, Mapping))


def _selector(obj: Obj) -> str:
    labels = _get(obj, "spec", "selector", "matchLabels", default={})
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def _ports(obj: Obj) -> str:
    out = []
    for port in _get(obj, "spec", "ports", default=[]):
        text = f"{port.get('port', '')}"
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        out.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(out) or "<none>"


def _node_status(obj: Obj) -> str:
    for cond in _get(obj, "status", "conditions", default=[]):
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _replicas(obj: Obj, field: str) -> int:
    return int(_get(obj, "status", field, default=0))


def _ready_of(obj: Obj) -> str:
    return f"{_replicas(obj, 'readyReplicas')}/{int(_get(obj, 'spec', 'replicas', default=1))}"


_NAME: _Column = ("Name", "string", 0, "Name must be unique within a namespace.", _name)
_AGE: _Column = ("Age", "string", 0, "CreationTimestamp is a timestamp representing the server time when "
                 "this object was created.", _age)

_COLUMNS: dict[tuple[str, str], Sequence[_Column]] = {
    ("", "pods"): (
        _NAME,
        ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic.",
         _pod_ready),
        ("Status", "string", 0, "The aggregate status of the containers in this pod.", _pod_status),
        ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted.",
         _restarts),
        _AGE,
        ("IP", "string", 1, "IP address allocated to the pod.", lambda o: _get(o, "status", "podIP",
                                                                               default="<none>")),
        ("Node", "string", 1, "Name of the Node this pod runs on.", lambda o: _get(o, "spec", "nodeName",
                                                                                   default="<none>")),
    ),
    ("", "configmaps"): (
        _NAME,
        ("Data", "string", 0, "Number of keys.", lambda o: len(_get(o, "data", default={}))
         + len(_get(o, "binaryData", default={}))),
        _AGE,
    ),
    ("", "secrets"): (
        _NAME,
        ("Type", "string", 0, "The type of the secret.", lambda o: _get(o, "type", default="Opaque")),
        ("Data", "string", 0, "Number of keys.", lambda o: len(_get(o, "data", default={}))),
        _AGE,
    ),
    ("", "services"): (
        _NAME,
        ("Type", "string", 0, "The type of the service.",
         lambda o: _get(o, "spec", "type", default="ClusterIP")),
        ("Cluster-IP", "string", 0, "The cluster IP.",
         lambda o: _get(o, "spec", "clusterIP", default="<none>")),
        ("External-IP", "string", 0, "External IPs.", lambda o: ",".join(_get(o, "spec", "externalIPs",
                                                                               default=[])) or "<none>"),
        ("Port(s)", "string", 0, "The ports of the service.", _ports),
        _AGE,
    ),
    ("", "namespaces"): (
        _NAME,
        ("Status", "string", 0, "The status of the namespace.", lambda o: _get(o, "status", "phase",
                                                                                default="Active")),
        _AGE,
    ),
    ("", "nodes"): (
        _NAME,
        ("Status", "string", 0, "The status of the node.", _node_status),
        ("Roles", "string", 0, "The roles of the node.", lambda o: "<none>"),
        _AGE,
        ("Version", "string", 0, "Kubelet version.", lambda o: _get(o, "status", "nodeInfo", "kubeletVersion",
                                                                    default="")),
    ),
    ("", "events"): (
        ("Last Seen", "string", 0, "Time of the last occurrence.", _age),
        ("Type", "string", 0, "Type of this event.", lambda o: _get(o, "type", default="")),
        ("Reason", "string", 0, "Why the action was taken.", lambda o: _get(o, "reason", default="")),
        ("Object", "string", 0, "The object this event is about.",
         lambda o: f"{str(_get(o, 'involvedObject', 'kind', default='')).lower()}/"
                   f"{_get(o, 'involvedObject', 'name', default='')}"),
        ("Message", "string", 0, "A human-readable description.", lambda o: _get(o, "message", default="")),
    ),
    ("coordination.k8s.io", "leases"): (
        _NAME,
        ("Holder", "string", 0, "The holder of the lease.", lambda o: _get(o, "spec", "holderIdentity",
                                                                            default="")),
        _AGE,
    ),
    ("apps", "deployments"): (
        _NAME,
        ("Ready", "string", 0, "Number of the pod with ready state.", _ready_of),
        ("Up-to-date", "string", 0, "Total number of non-terminated pods with the desired template.",
         lambda o: _replicas(o, "updatedReplicas")),
        ("Available", "string", 0, "Number of available pods.", lambda o: _replicas(o, "availableReplicas")),
        _AGE,
        ("Containers", "string", 1, "Names of each container in the template.",
         lambda o: _containers(o, "name")),
        ("Images", "string", 1, "Images referenced by each container in the template.",
         lambda o: _containers(o, "image")),
        ("Selector", "string", 1, "Label selector for pods.", _selector),
    ),
    ("apps", "replicasets"): (
        _NAME,
        ("Desired", "integer", 0, "Number of desired pods.", lambda o: int(_get(o, "spec", "replicas",
                                                                                 default=1))),
        ("Current", "integer", 0, "Number of actually running pods.", lambda o: _replicas(o, "replicas")),
        ("Ready", "integer", 0, "Number of ready pods.", lambda o: _replicas(o, "readyReplicas")),
        _AGE,
    ),
    ("apps", "statefulsets"): (
        _NAME,
        ("Ready", "string", 0, "Number of the pod with ready state.", _ready_of),
        _AGE,
    ),
}


def _columns(rt: ResourceType) -> Sequence[_Column]:
    return _COLUMNS.get((rt.group, rt.plural), (_NAME, _AGE))


def _row_object(obj: Obj, rt: ResourceType, include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return {"apiVersion": rt.api_version, "kind": rt.kind, **obj}
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": dict(obj.get("metadata") or {})}


def table(rt: ResourceType, objects: Sequence[Obj], *, include_object: str = "Metadata",
          list_meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Table of ``objects`` (``includeObject``: ``None``, ``Metadata`` or ``Object``)."""
    columns = _columns(rt)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [cell(obj) for *_, cell in columns]}
        embedded = _row_object(obj, rt, include_object)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(list_meta or {}),
        "columnDefinitions": [{"name": name, "type": kind, "format": "name" if name == "Name" else "",
                               "description": description, "priority": priority}
                              for name, kind, priority, description, _ in columns],
        "rows": rows,
    }
