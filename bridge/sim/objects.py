"""Realistic object factories for the churn generator, the demo and the benchmarks.

A Pod that a Deployment created and a kubelet runs has owner references, a pod-template-hash label,
probes, resources, volumes, a full status with conditions and container statuses, and managedFields
from two managers; decode and memory costs are dominated by exactly these parts, so benchmarks must
use objects shaped like them. ``size_bytes`` pads the main container's environment (and, for the last
few bytes, an annotation) so a Pod's JSON reaches a chosen size.
"""

from __future__ import annotations

import random
import string
import time
import uuid
from typing import Any

import orjson

KubeObject = dict[str, Any]
"""The simulator's objects: JSON dicts it owns and changes (the bridge's objects are read-only)."""


__all__ = ["PADDING_ANNOTATION", "make_pod", "mutate_pod_labels", "mutate_pod_spec", "mutate_pod_status"]

PADDING_ANNOTATION = "sim.kube-event-bridge.io/padding"
_APPS = ("web", "api", "worker", "cache", "ingest", "billing", "search", "auth", "frontend", "scheduler")
_IMAGES = ("nginx:1.25.3", "ghcr.io/acme/api:2.14.1", "redis:7.2.4", "ghcr.io/acme/worker:5.0.2",
           "envoyproxy/envoy:v1.29.1", "python:3.11-slim")


def _word(rng: random.Random, n: int, alphabet: str = string.ascii_lowercase + string.digits) -> str:
    return "".join(rng.choices(alphabet, k=n))


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _ts(seconds_ago: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def _size(obj: KubeObject) -> int:
    return len(orjson.dumps(obj))


def make_pod(name: str, namespace: str = "default", size_bytes: int | None = None,
             rng: random.Random | None = None) -> KubeObject:
    """A Pod as a Deployment's ReplicaSet creates it and the kubelet reports it, ready to ``create``.

    No uid/resourceVersion/creationTimestamp: the store assigns them. With ``size_bytes`` the JSON is
    padded to that size (within a few bytes); the natural size is about 4.5 KB.
    """
    rng = rng or random.Random()
    app = rng.choice(_APPS)
    template_hash = _word(rng, 10)
    image = rng.choice(_IMAGES)
    node = f"node-{rng.randrange(1, 200):03d}"
    pod_ip = f"10.{rng.randrange(0, 255)}.{rng.randrange(0, 255)}.{rng.randrange(2, 254)}"
    host_ip = f"192.168.{rng.randrange(0, 255)}.{rng.randrange(2, 254)}"
    started = _ts(rng.uniform(60, 86_400))
    owner_uid = _uid(rng)
    container_id = "containerd://" + _word(rng, 64, "0123456789abcdef")
    main: dict[str, Any] = {
        "name": app,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
        "env": [
            {"name": "POD_NAME",
             "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE",
             "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
            {"name": "LOG_LEVEL", "value": rng.choice(["info", "debug", "warn"])},
        ],
        "resources": {"limits": {"cpu": "500m", "memory": "512Mi"},
                      "requests": {"cpu": f"{rng.choice([50, 100, 250])}m", "memory": "128Mi"}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                          "initialDelaySeconds": 10, "timeoutSeconds": 1, "periodSeconds": 10,
                          "successThreshold": 1, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080, "scheme": "HTTP"},
                           "timeoutSeconds": 1, "periodSeconds": 5, "successThreshold": 1,
                           "failureThreshold": 3},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": True},
                         {"name": "kube-api-access", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    pod: KubeObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{app}-{template_hash}-",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": template_hash,
                       "app.kubernetes.io/part-of": "shop", "tier": rng.choice(["frontend", "backend"])},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090",
                            "kubectl.kubernetes.io/restartedAt": started},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": f"{app}-{template_hash}", "uid": owner_uid, "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": started, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {},
                                                                                 "f:pod-template-hash": {}},
                                             "f:ownerReferences": {".": {},
                                                                   f'k:{{"uid":"{owner_uid}"}}': {}}},
                              "f:spec": {'f:containers': {f'k:{{"name":"{app}"}}': {
                                  ".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                                  "f:ports": {}, "f:resources": {}, "f:livenessProbe": {},
                                  "f:readinessProbe": {}}},
                                  "f:dnsPolicy": {}, "f:restartPolicy": {}, "f:volumes": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": started,
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {},
                                           "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}},
            ],
        },
        "spec": {
            "containers": [main],
            "volumes": [
                {"name": "config", "configMap": {"name": f"{app}-config", "defaultMode": 420}},
                {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ]}},
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": app,
            "nodeName": node,
            "securityContext": {"runAsUser": 10001, "fsGroup": 10001},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": host_ip,
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": started,
            "containerStatuses": [{
                "name": app, "state": {"running": {"startedAt": started}}, "lastState": {}, "ready": True,
                "restartCount": 0, "image": image,
                "imageID": f"{image}@sha256:" + _word(rng, 64, "0123456789abcdef"),
                "containerID": container_id, "started": True,
            }],
            "qosClass": "Burstable",
        },
    }
    if size_bytes is not None:
        _pad(pod, size_bytes, rng)
    return pod


def _pad(pod: KubeObject, size_bytes: int, rng: random.Random) -> None:
    env: list[dict[str, Any]] = pod["spec"]["containers"][0]["env"]
    current = _size(pod)
    # Whole env entries first (about 80 bytes each), then an annotation for the remainder.
    while size_bytes - current > 160:
        value = _word(rng, 48)
        entry = {"name": f"FEATURE_FLAG_{len(env):04d}", "value": value}
        env.append(entry)
        current += len(orjson.dumps(entry)) + 1
    remainder = size_bytes - current
    if remainder > 0:
        overhead = len(orjson.dumps({PADDING_ANNOTATION: ""})) - 1  # key, quotes, colon and a comma
        pod["metadata"]["annotations"][PADDING_ANNOTATION] = "x" * max(0, remainder - overhead)


# Every mutation below changes the object, so each one is a real event (no-op updates are dropped
# by the store, as kube-apiserver drops them).


def mutate_pod_labels(pod: KubeObject, rng: random.Random) -> dict[str, Any]:
    """A merge patch changing metadata only (no generation bump), as controllers and users do."""
    labels = pod.get("metadata", {}).get("labels") or {}
    revision = int(labels.get("revision", "0")) + rng.randrange(1, 10)
    return {"metadata": {"labels": {"revision": str(revision)},
                         "annotations": {"sim.kube-event-bridge.io/touched": _ts()}}}


def mutate_pod_spec(pod: KubeObject, rng: random.Random) -> dict[str, Any]:
    """A merge patch changing the spec (bumps metadata.generation): a longer deadline."""
    current = int(pod.get("spec", {}).get("activeDeadlineSeconds") or 600)
    return {"spec": {"activeDeadlineSeconds": current + rng.randrange(1, 600)}}


def mutate_pod_status(pod: KubeObject, rng: random.Random) -> dict[str, Any]:
    """A status-subresource merge patch as the kubelet sends it: a readiness flip (a restart when the
    container goes unready)."""
    status = pod.get("status") or {}
    statuses = [dict(s) for s in status.get("containerStatuses") or []]
    was_ready = all(bool(s.get("ready")) for s in statuses) if statuses else True
    ready = not was_ready
    for s in statuses:
        s["restartCount"] = int(s.get("restartCount", 0)) + (0 if ready else 1)
        s["ready"] = ready
    conditions = [dict(c) for c in status.get("conditions") or []]
    for c in conditions:
        if c.get("type") in ("Ready", "ContainersReady"):
            c["status"] = "True" if ready else "False"
            c["lastTransitionTime"] = _ts()
    return {"status": {"containerStatuses": statuses, "conditions": conditions}}
