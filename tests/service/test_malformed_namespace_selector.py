"""``keb_malformed_objects_total`` for a resource watched with a ``namespace_selector``, end to end
against the simulator over HTTP (the service in-process, a file sink read back).

The selector wraps the resource's HTTP lister-watcher (:class:`~bridge.informer.namespaces.
NamespaceFilteredListerWatcher`); what the wrapped one quarantined is counted for the resource all
the same, under its informer, as for a resource watched without a selector."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from tests.service.test_service import eventually, lines, metric

pytestmark = pytest.mark.usefixtures("own_cwd")


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


def _malformed(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("keb_malformed_objects_total{")]


async def test_objects_quarantined_under_a_namespace_selector_are_counted(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "a", "b")) as sim:
        client = ApiClient(server=sim.url)
        try:
            for ns, team in (("a", "pay"), ("b", "other")):
                await client.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"team": team}}})
            # Nested deeper than the decoders' 200 levels: quarantined as ``depth``.
            sim.store.create("configmaps", {"metadata": {"name": "deep", "namespace": "a"},
                                            "data": {}, "binaryData": _nested(210)})
            sim.store.create("configmaps", {"metadata": {"name": "ok", "namespace": "a"}, "data": {"v": "0"}})
            events = tmp_path / "events.jsonl"
            config = BridgeConfig.model_validate({
                "cluster": "test",
                "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
                               "in_cluster": "false"},
                "resources": [{"resource": "configmaps", "namespace_selector": "team=pay"}],
                "sinks": [{"name": "file", "kind": "file", "path": str(events)}],
                "checkpoint": {"store": "none"},
                "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
                "shutdown_deadline": 10,
            })
            service = BridgeService(config=config)
            task = asyncio.create_task(service.run(), name="service-under-test")
            try:
                await eventually(lambda: {e.get("name") for e in lines(events)} >= {"deep", "ok"},
                                 what="both objects of namespace a")
                (deep,) = [e for e in lines(events) if e.get("name") == "deep"]
                assert deep["malformed"] == "depth"
                text = service.telemetry.render_prometheus().decode()
                (counted,) = _malformed(text)
                assert 'informer="configmaps.all.' in counted
                assert metric(text, "keb_malformed_objects_total", resource="configmaps",
                              reason="depth") == 1.0
            finally:
                service.stop_event.set()
                assert await task == 0
        finally:
            await client.close()
