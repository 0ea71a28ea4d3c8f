"""The chart checks the bridge configuration before anything is installed: the values schema embeds
the configuration's JSON schema generated from the pydantic models, the templates resolve resource
names and check what a schema cannot. Everything goes through the real Helm engine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError, lint

from bridge.service.config_schema import builtin_resources_template, chart_values_schema, render_json
from bridge.service.resource_names import BUILTIN_RESOURCES, resolve_builtin
from bridge.storage.checkpoint import informer_id
from tests.service.test_chart import CHART, find, render

ROOT = CHART.parents[1]
SCHEMA = CHART / "values.schema.json"


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def config(**extra: Any) -> dict[str, Any]:
    return {"config": {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "stdout"}],
                       **extra}}


# --- one source of truth ----------------------------------------------------------------------------


def test_committed_schema_and_resource_table_are_generated_from_the_models() -> None:
    committed = SCHEMA.read_text()
    assert render_json(chart_values_schema(json.loads(committed))) == committed, \
        "values.schema.json is out of date: run scripts/gen-chart-schema"
    table = CHART / "templates" / "_builtin_resources.tpl"
    assert builtin_resources_template() == table.read_text(), \
        "_builtin_resources.tpl is out of date: run scripts/gen-chart-schema"
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-chart-schema"), "--check"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_the_check_notices_a_model_change(monkeypatch: pytest.MonkeyPatch) -> None:
    # A schema generated from changed models differs from the committed one.
    from bridge.service import config_schema

    original = config_schema.bridge_config_schema

    def changed() -> dict[str, Any]:
        out = original()
        out["config"]["properties"]["cluster"]["minLength"] = 2
        return out

    monkeypatch.setattr(config_schema, "bridge_config_schema", changed)
    committed = SCHEMA.read_text()
    assert render_json(chart_values_schema(json.loads(committed))) != committed


# --- bad values rejected by template and lint --------------------------------------------------------

# Rejected by the values schema: `helm lint`, `template` and `install` all refuse them.
BAD_FOR_SCHEMA = [
    pytest.param({"config": {"checkpiont": {"store": "file"}}}, "'checkpiont' not allowed",
                 id="misspelled-key"),
    pytest.param(config(sinks=[{"name": "k", "kind": "kafak"}]), "kind", id="unknown-kind"),
    pytest.param(config(sinks=[{"name": "k", "kind": "kafka"}]), "brokers", id="kafka-without-brokers"),
    pytest.param(config(sinks=[{"name": "k", "kind": "kafka", "brokers": "k:9092", "lingerms": 5}]),
                 "'lingerms' not allowed", id="unknown-sink-option"),
    pytest.param(config(sinks=[{"name": "h", "kind": "webhook"}]), "url", id="webhook-without-url"),
    pytest.param(config(sinks=[{"name": "n", "kind": "nats", "servers": []}]), "servers",
                 id="nats-no-servers"),
    pytest.param(config(checkpoint={"store": "configmap", "interval": 0}), "interval", id="interval-zero"),
    pytest.param(config(sinks=[{"name": "f", "kind": "file", "path": "/x", "filter": 3}]), "filter",
                 id="non-string-filter"),
    pytest.param(config(sinks=[{"name": "f", "kind": "file", "path": "/x", "filter": ["a", "b"]}]), "filter",
                 id="list-filter"),
    pytest.param(config(sinks=[{"name": "f", "kind": "file", "path": "/x", "filter_errors": "ignore"}]),
                 "filter_errors", id="bad-filter-errors"),
    pytest.param(config(sinks=[{"name": "f", "kind": "file", "path": "/x", "fields": "metadata"}]), "fields",
                 id="fields-not-a-list"),
    pytest.param(config(leader_election={"enabled": True}), "'leader_election' not allowed",
                 id="chart-owned-key"),
    pytest.param({"image": {"digest": "latest"}}, "digest", id="bad-digest"),
    pytest.param({"extraVolumes": [{"name": "config", "emptyDir": {}}]}, "extraVolumes",
                 id="volume-name-clash"),
]

# Rejected by the templates (what a JSON schema cannot express: values compared with each other,
# names resolved): `helm template` and `install` refuse them; `helm lint` runs templates in a lenient
# mode in which `fail` only logs, so lint does not.
BAD_FOR_TEMPLATES = [
    pytest.param({"leaderElection": {"enabled": True, "leaseDuration": 5, "renewDeadline": 10}},
                 r"leaseDuration \(5\) must be greater than leaderElection.renewDeadline \(10\)",
                 id="lease-lt-renew"),
    pytest.param({"leaderElection": {"leaseDuration": 15, "renewDeadline": 2, "retryPeriod": 2}},
                 "1.2 \\* leaderElection.retryPeriod", id="renew-lt-retry"),
    pytest.param(config(resources=[{"resource": "widgets"}]),
                 "\"widgets\" is not a built-in Kubernetes resource", id="bare-custom-resource"),
    pytest.param(config(resources=[{"resource": "deploymentz.apps"}]),
                 "the API group apps has no resource", id="unknown-in-builtin-group"),
    pytest.param(config(resources=[{"resource": "deploy"}, {"resource": "deployments.apps"}]),
                 "config.resources.0 \\(\"deploy\"\\) and config.resources.1 \\(\"deployments.apps\"\\)",
                 id="alias-twice"),
]


@pytest.mark.parametrize(("values", "message"), BAD_FOR_SCHEMA)
def test_bad_values_are_rejected_by_lint_and_template(chart: Any, values: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(HelmError, match=message):
        chart.render(values=values, name="keb", namespace="ops")
    report = lint(str(CHART), values=values, namespace="ops")
    assert any(re.search(message, e) for e in report["errors"]), report


@pytest.mark.parametrize(("values", "message"), BAD_FOR_TEMPLATES)
def test_bad_values_are_rejected_by_template(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        chart.render(values=values, name="keb", namespace="ops")


def test_valid_sinks_of_every_kind_pass(chart: Any) -> None:
    docs = render(chart, config(sinks=[
        {"name": "k", "kind": "kafka", "brokers": "kafka:9092", "linger_ms": 5,
         "destination": "k8s.{resource}"},
        {"name": "k2", "kind": "kafka", "bootstrap_servers": "kafka:9092"},
        {"name": "n", "kind": "nats", "servers": ["nats://nats:4222"]},
        {"name": "j", "kind": "jetstream", "servers": ["nats://nats:4222"], "stream": {"name": "K8S"}},
        {"name": "h", "kind": "webhook", "url": "https://hooks.example.com/x",
         "hmac_secret_file": "/var/run/secrets/kube-event-bridge/hook/secret", "batch": {"max_events": 10}},
        {"name": "f", "kind": "file", "path": "/var/lib/kube-event-bridge/events.jsonl"},
        {"name": "o", "kind": "stdout", "routing": {"event_types": ["added", "deleted"]}},
        {"name": "w", "kind": "stdout", "filter": "object.type == 'Warning'", "filter_errors": "drop",
         "fields": ["metadata.name", "reason", "message"]},
    ]))
    (cm,) = find(docs, "ConfigMap")
    sinks = yaml.safe_load(cm["data"]["config.yaml"])["sinks"]
    assert [s["name"] for s in sinks] == ["k", "k2", "n", "j", "h", "f", "o", "w"]
    assert sinks[-1]["filter"] == "object.type == 'Warning'"


# --- resource names ----------------------------------------------------------------------------------


def rules(chart: Any, resources: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    docs = render(chart, config(resources=resources, checkpoint={"store": "file"}))
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in find(docs, "ClusterRole") + find(docs, "Role"):
        out[d["kind"], d["metadata"].get("namespace", "")] = d["rules"]
    return out


def test_short_names_kinds_and_versions_resolve_to_the_plural_and_group(chart: Any) -> None:
    got = rules(chart, [
        {"resource": "deploy"},
        {"resource": "Deployment", "namespace": "web"},
        {"resource": "sts"},
        {"resource": "ev"},
        {"resource": "events.events.k8s.io", "namespace": "web"},
        {"resource": "crd"},
        {"resource": "cronjobs.v1.batch", "namespace": "web"},
        {"resource": "ingresses.networking.k8s.io/v1"},
        {"resource": "po"},
        {"resource": "widgets.v1alpha1.example.com"},
    ])
    lw = ["list", "watch"]
    assert got["ClusterRole", ""] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": lw},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": lw},
        {"apiGroups": [""], "resources": ["events"], "verbs": lw},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": lw},
        {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": lw},
        {"apiGroups": [""], "resources": ["pods"], "verbs": lw},
        {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": lw},
    ]
    assert got["Role", "web"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": lw},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": lw},
        {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": lw},
    ]


def test_the_chart_resolves_every_name_of_every_builtin_resource_as_the_bridge_does(chart: Any) -> None:
    names = sorted({n for r in BUILTIN_RESOURCES for n in (r.plural, r.kind, *r.short_names)})
    resources = [{"resource": n, "namespace": f"ns{i}"} for i, n in enumerate(names)]
    got = rules(chart, resources)
    for i, name in enumerate(names):
        expected = resolve_builtin(name)
        assert expected is not None
        assert got["Role", f"ns{i}"] == [{"apiGroups": [expected.group], "resources": [expected.plural],
                                          "verbs": ["list", "watch"]}], name


# --- the checkpoint Role -----------------------------------------------------------------------------


def test_checkpoint_role_names_the_bridges_own_configmaps(chart: Any) -> None:
    resources = [
        {"resource": "pods"},
        {"resource": "Deployment", "namespace": "Web_Apps", "label_selector": "tier in (web, api)"},
        {"resource": "widgets.example.com/v1", "field_selector": "metadata.name!=x"},
    ]
    docs = render(chart, config(resources=resources, checkpoint={"store": "configmap", "shards": False}))
    (role,) = find(docs, "Role", "ops-keb-checkpoints")
    cm_rules = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
    manifests = [f"keb-kube-event-bridge-checkpoint-{informer_id(r['resource'], r.get('namespace', ''), r.get('label_selector', ''), r.get('field_selector', ''))}"  # noqa: E501
                 for r in resources]
    # Each manifest and its known-object journal (ConfigMapCheckpointStore.journal_name).
    expected = [name for m in manifests for name in (m, f"{m}-journal")]
    assert cm_rules == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": expected,
         "verbs": ["get", "update", "patch", "delete"]},
    ]
    (cm,) = find(docs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["checkpoint"]["shards"] is False  # the store never needs more than those names

    # Shards and journal chunks are on by default (a big cluster's first list must be recorded):
    # their names are new on every write, hence get/list/delete on the namespace's ConfigMaps.
    docs = render(chart, config(resources=resources, checkpoint={"store": "configmap"}))
    (cm,) = find(docs, "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"])["checkpoint"]["shards"] is True
    (role,) = find(docs, "Role", "ops-keb-checkpoints")
    cm_rules = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
    assert cm_rules[2] == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "delete"]}

    docs = render(chart, config(resources=resources,
                                checkpoint={"store": "configmap", "name_prefix": "cp", "shards": True}))
    (role,) = find(docs, "Role", "ops-keb-checkpoints")
    cm_rules = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
    assert cm_rules[1]["resourceNames"] == [n.replace("keb-kube-event-bridge-checkpoint-", "cp-")
                                            for n in expected]
    assert cm_rules[2] == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "delete"]}


# --- image, volumes, PrometheusRule ------------------------------------------------------------------


def test_image_digest_and_extra_volumes(chart: Any) -> None:
    digest = "sha256:" + "ab" * 32
    docs = render(chart, {
        "image": {"repository": "registry.example.com/keb", "tag": "1.2.3", "digest": digest},
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
    })
    (dep,) = find(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"registry.example.com/keb@{digest}"
    assert {"name": "ca", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
    assert {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True} in container["volumeMounts"]
    (dep,) = find(render(chart, {"image": {"repository": "r/keb", "tag": "1.2.3"}}), "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "r/keb:1.2.3"


def _doc_alerts() -> dict[str, dict[str, Any]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    block = re.search(r"```yaml\n(groups:.*?)```", text, re.S)
    assert block
    (group,) = yaml.safe_load(block.group(1))["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_prometheus_rule_carries_the_documented_alerts(chart: Any) -> None:
    assert find(render(chart), "PrometheusRule") == []
    docs = render(chart, {"metrics": {"prometheusRule": {
        "enabled": True, "labels": {"release": "prom"}, "additionalLabels": {"severity": "page"}}}})
    (rule,) = find(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    (group,) = rule["spec"]["groups"]
    rendered = {r["alert"]: r for r in group["rules"]}
    documented = _doc_alerts()
    assert rendered.keys() == documented.keys()
    for name, doc in documented.items():
        got = rendered[name]
        # The chart limits each expression to the release's namespace; otherwise the same rule.
        expr = got["expr"].replace('{namespace="ops"}', "").replace('namespace="ops",', "")
        assert expr == doc["expr"], name
        assert got.get("for") == doc.get("for"), name
        assert got["annotations"] == doc["annotations"], name
        assert got["labels"] == {"severity": "page"}
        assert 'namespace="ops"' in got["expr"]


def test_every_documented_configuration_is_accepted_by_the_chart(chart: Any) -> None:
    # The chart's schema and the bridge agree: every configuration example of the docs (each of
    # which tests/test_docs.py loads into the bridge) renders, minus the keys the chart owns.
    from tests.test_docs import CONFIGS

    assert CONFIGS
    for where, text in CONFIGS:
        loaded = yaml.safe_load(text)
        data: dict[str, Any] = {"sinks": loaded} if isinstance(loaded, list) else dict(loaded)
        data.setdefault("resources", [{"resource": "pods"}])
        for key in ("server", "leader_election"):
            data.pop(key, None)
        try:
            chart.render(values={"config": data}, name="keb", namespace="ops")
        except HelmError as exc:
            pytest.fail(f"{where}: {exc}")


def test_rendered_manifests_are_valid_kubernetes_objects(chart: Any) -> None:
    # Every object the chart renders with every feature on, against Kubernetes 1.30's own schemas
    # (strict: an unknown field is an error). The prometheus-operator kinds have no schema there.
    import kubernetes_validate

    docs = render(chart, {
        "replicaCount": 2, "leaderElection": {"enabled": True},
        "image": {"digest": "sha256:" + "ab" * 32},
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
        "secretMounts": [{"name": "kafka", "secretName": "kafka-creds"}],
        "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {}}]},
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        "config": {"resources": [{"resource": "deploy"}, {"resource": "po", "namespace": "web"},
                                 {"resource": "widgets.example.com"}],
                   "sinks": [{"name": "s", "kind": "stdout"}],
                   "checkpoint": {"store": "configmap", "shards": True}},
    })
    kinds = set()
    for doc in docs:
        kinds.add(doc["kind"])
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    assert {"Deployment", "Role", "ClusterRole", "PodDisruptionBudget", "NetworkPolicy",
            "PrometheusRule", "ServiceMonitor"} <= kinds
