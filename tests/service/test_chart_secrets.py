"""The chart keeps secrets out of its ConfigMap, fences the pod with a NetworkPolicy and puts the
admin listener behind a token, by default (real Helm engine: helm-python-sdk).

Secrets reach the bridge only as files (``secretMounts``, referenced with ``${file:…}`` or the
``*_file`` options): the values schema refuses an inline ``hmac_secret``, ``bearer_token``,
``password``, and secret-named headers or librdkafka properties, which the ConfigMap would
otherwise carry in clear text to anyone allowed to read ConfigMaps of the namespace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError

from tests.service.test_chart import CHART, find, render

SECRET = "s3cr3t-inline-value"
REF = "${file:/var/run/secrets/kube-event-bridge/hook/value}"


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def _with_sink(sink: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {"config": {"resources": [{"resource": "pods"}], "sinks": [sink]}, **values}


def _webhook(**options: Any) -> dict[str, Any]:
    return {"name": "hook", "kind": "webhook", "url": "https://hooks.example.com/in", **options}


def _config_of(docs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    (cm,) = find(docs, "ConfigMap")
    text: str = cm["data"]["config.yaml"]
    return text, yaml.safe_load(text)


INLINE = {
    "hmac_secret": _webhook(hmac_secret=SECRET),
    "bearer_token": _webhook(auth={"bearer_token": SECRET}),
    "password": _webhook(auth={"username": "u", "password": SECRET}),
    "Authorization header": _webhook(headers={"Authorization": f"Bearer {SECRET}"}),
    "X-Api-Token header": _webhook(headers={"X-Api-Token": SECRET}),
    "sasl.password": {"name": "k", "kind": "kafka", "brokers": "kafka:9092",
                      "librdkafka": {"sasl.username": "u", "sasl.password": SECRET}},
}


@pytest.mark.parametrize("case", sorted(INLINE))
def test_an_inline_secret_is_refused_by_the_schema(chart: Any, case: str) -> None:
    with pytest.raises(HelmError) as err:
        render(chart, _with_sink(INLINE[case]))
    assert "values don't meet the specifications of the schema" in str(err.value), err.value


@pytest.mark.parametrize("case", sorted(INLINE))
def test_the_same_secret_as_a_file_reference_is_accepted(chart: Any, case: str) -> None:
    sink = yaml.safe_load(yaml.safe_dump(INLINE[case]).replace(SECRET, REF))
    docs = render(chart, _with_sink(sink, secretMounts=[{"name": "hook", "secretName": "hook-secret"}]))
    text, _cfg = _config_of(docs)
    assert SECRET not in text
    assert REF in text


def test_harmless_headers_and_properties_stay_inline(chart: Any) -> None:
    docs = render(chart, _with_sink(_webhook(headers={"X-Team": "infra"})))
    _text, cfg = _config_of(docs)
    assert cfg["sinks"][0]["headers"] == {"X-Team": "infra"}
    render(chart, _with_sink({"name": "k", "kind": "kafka", "brokers": "kafka:9092",
                              "librdkafka": {"sasl.username": "u", "linger.ms": 5}}))


def test_the_network_policy_is_on_by_default_and_the_scrape_source_configurable(chart: Any) -> None:
    (policy,) = find(render(chart), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    source = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    (policy,) = find(render(chart, {"networkPolicy": {"metricsFrom": source}}), "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == source
    assert find(render(chart, {"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


TOKEN_FILE = "/var/run/secrets/kube-event-bridge/admin-token/token"


def test_the_admin_token_is_on_by_default_from_a_generated_secret(chart: Any) -> None:
    docs = render(chart)
    _text, cfg = _config_of(docs)
    assert cfg["server"]["admin_token_file"] == TOKEN_FILE
    (secret,) = find(docs, "Secret")
    assert secret["metadata"]["name"] == "keb-kube-event-bridge-admin-token"
    token = secret["data"]["token"]
    assert len(token) >= 40
    (dep,) = find(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert {"name": "admin-token", "mountPath": "/var/run/secrets/kube-event-bridge/admin-token",
            "readOnly": True} in pod["containers"][0]["volumeMounts"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "admin-token"]
    assert vol["secret"]["secretName"] == "keb-kube-event-bridge-admin-token"


def test_the_admin_token_from_an_existing_secret(chart: Any) -> None:
    docs = render(chart, {"adminToken": {"existingSecret": "my-admin", "key": "bearer"}})
    assert find(docs, "Secret") == []
    _text, cfg = _config_of(docs)
    assert cfg["server"]["admin_token_file"] == "/var/run/secrets/kube-event-bridge/admin-token/bearer"
    (dep,) = find(docs, "Deployment")
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "admin-token"]
    assert vol["secret"]["secretName"] == "my-admin"


def test_the_admin_token_can_be_turned_off_or_left_to_the_config(chart: Any) -> None:
    docs = render(chart, {"adminToken": {"enabled": False}})
    assert find(docs, "Secret") == []
    _text, cfg = _config_of(docs)
    assert "admin_token_file" not in cfg["server"]
    own = "/var/run/secrets/kube-event-bridge/admin/token"
    docs = render(chart, {"config": {"resources": [{"resource": "pods"}],
                                     "sinks": [{"name": "s", "kind": "stdout"}],
                                     "server": {"admin_token_file": own}},
                          "secretMounts": [{"name": "admin", "secretName": "bridge-admin"}]})
    _text, cfg = _config_of(docs)
    assert cfg["server"]["admin_token_file"] == own
    assert find(docs, "Secret") == []
