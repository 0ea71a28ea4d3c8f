"""The chart and the admin listener: POST /snapshot is never exposed by the Service or the
NetworkPolicy; a bearer token comes from a mounted Secret (real Helm engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python import Chart, HelmError

from bridge.service.config import BridgeConfig
from tests.service.test_chart import CHART, as_mounted, find, render


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with Chart.load(str(CHART)) as c:
        yield c


def _config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = find(docs, "ConfigMap")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def test_the_admin_listener_is_loopback_and_never_exposed(chart: Any, tmp_path: Path) -> None:
    docs = render(chart, {"networkPolicy": {"enabled": True}})
    cfg = yaml.safe_load(as_mounted(yaml.safe_dump(_config(docs)), tmp_path))
    server = BridgeConfig.model_validate(cfg).server
    assert (server.host, server.port) == ("0.0.0.0", 8080)
    assert (server.admin_host, server.admin_port) == ("127.0.0.1", 8081)
    assert server.admin_token_file == str(tmp_path / "admin-token")  # on by default
    (svc,) = find(docs, "Service")
    assert [p["port"] for p in svc["spec"]["ports"]] == [8080]
    (policy,) = find(docs, "NetworkPolicy")
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == ["http"]
    (dep,) = find(docs, "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [8080]


def test_an_admin_token_from_a_mounted_secret(chart: Any) -> None:
    token = "/var/run/secrets/kube-event-bridge/admin/token"
    docs = render(chart, {
        "config": {"resources": [{"resource": "pods"}], "sinks": [{"name": "s", "kind": "stdout"}],
                   "server": {"admin_token_file": token}},
        "secretMounts": [{"name": "admin", "secretName": "bridge-admin"}],
    })
    cfg = _config(docs)
    assert cfg["server"] == {"admin_token_file": token, "host": "0.0.0.0", "port": 8080}
    (dep,) = find(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert {"name": "secret-admin", "mountPath": "/var/run/secrets/kube-event-bridge/admin",
            "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert any(v.get("secret", {}).get("secretName") == "bridge-admin" for v in pod["volumes"])


@pytest.mark.parametrize("key", ["host", "port"])
def test_the_public_listener_is_the_charts_own(chart: Any, key: str) -> None:
    with pytest.raises(HelmError, match="server"):
        render(chart, {"config": {"resources": [{"resource": "pods"}],
                                  "sinks": [{"name": "s", "kind": "stdout"}],
                                  "server": {key: "0.0.0.0" if key == "host" else 1}}})
