"""``namespace_selector``: one cluster-wide watch keeping the objects of namespaces whose labels match,
end to end against the simulator (the service, a file sink read back).

Objects of matching namespaces arrive, others never do; a namespace that starts matching brings its
objects in as ``added``; one that stops matching makes them leave as ``deleted`` marked
``leftselector: "true"`` (they still exist), exactly as a label-selector exit; a real delete is not
marked; a new matching namespace is followed; one informer serves every namespace."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import ConfigurationError
from bridge.kube.apiclient import ApiClient
from bridge.service.config import BridgeConfig, load_config
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from tests.service.test_service import eventually, lines

pytestmark = pytest.mark.usefixtures("own_cwd")


def _config(sim: Simulator, tmp_path: Path, events: Path, **resource: Any) -> BridgeConfig:
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
                       "in_cluster": "false"},
        "resources": [{"resource": "configmaps", **resource}],
        "sinks": [{"name": "file", "kind": "file", "path": str(events)}],
        "checkpoint": {"store": "none"},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


async def _label(client: ApiClient, namespace: str, team: str) -> None:
    await client.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"team": team}}})


def _ready(service: BridgeService) -> bool:
    return service.readiness().ready


def _seen(events: Path) -> list[tuple[str, str, str | None]]:
    return [(e["type"].rsplit(".", 1)[1], f"{e['namespace']}/{e['name']}", e.get("leftselector"))
            for e in lines(events) if e["type"].rsplit(".", 1)[1] in ("added", "updated", "deleted")]


async def test_namespaces_enter_and_leave_the_scope_by_their_labels(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "a", "b", "c")) as sim:
        client = ApiClient(server=sim.url)
        for ns, team in (("a", "pay"), ("b", "other"), ("c", "pay")):
            await _label(client, ns, team)
            await client.create(f"/api/v1/namespaces/{ns}/configmaps",
                                {"metadata": {"name": "cm"}, "data": {"v": "0"}})
        events = tmp_path / "events.jsonl"
        service = BridgeService(config=_config(sim, tmp_path, events, namespace_selector="team=pay"))
        task = asyncio.create_task(service.run(), name="service-under-test")
        try:
            await eventually(lambda: service.readiness().ready, what="readiness")
            await eventually(lambda: len(_seen(events)) == 2, what="the objects of a and c")
            assert sorted(_seen(events)) == [("added", "a/cm", None), ("added", "c/cm", None)]
            # b starts matching: its object enters.
            await _label(client, "b", "pay")
            await eventually(lambda: len(_seen(events)) == 3, what="b's object entering")
            assert _seen(events)[2] == ("added", "b/cm", None)
            # a stops matching: its object leaves, marked; a change there is no longer followed.
            await _label(client, "a", "none")
            await eventually(lambda: len(_seen(events)) == 4, what="a's object leaving")
            assert _seen(events)[3] == ("deleted", "a/cm", "true")
            await client.patch("/api/v1/namespaces/a/configmaps/cm", {"data": {"v": "1"}})
            # A real delete in scope is not marked; a change in scope is followed.
            await client.delete("/api/v1/namespaces/c/configmaps/cm")
            await client.patch("/api/v1/namespaces/b/configmaps/cm", {"data": {"v": "1"}})
            await eventually(lambda: len(_seen(events)) == 6, what="c's delete and b's update")
            assert _seen(events)[4:] == [("deleted", "c/cm", None), ("updated", "b/cm", None)]
            # A new namespace that matches is followed.
            await client.create("/api/v1/namespaces", {"metadata": {"name": "d", "labels": {"team": "pay"}}})
            await asyncio.sleep(0.5)
            await client.create("/api/v1/namespaces/d/configmaps", {"metadata": {"name": "cm"}})
            await eventually(lambda: len(_seen(events)) == 7, what="d's object")
            assert _seen(events)[6] == ("added", "d/cm", None)
            await asyncio.sleep(0.5)
            assert len(_seen(events)) == 7  # nothing of a after it left
            # One informer, cluster-wide, for every namespace.
            pipeline = service._state.pipeline
            assert pipeline is not None
            assert len(pipeline.informers) == 1
        finally:
            service.stop_event.set()
            await task
            await client.close()


def test_a_namespace_selector_with_a_namespace_or_of_bad_grammar_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("resources: [{resource: pods, namespace: web, namespace_selector: team=pay}]\n"
                   "sinks: [{name: s, kind: stdout}]\n")
    with pytest.raises(ConfigurationError, match=r"resources\.0\.namespace_selector: with namespace 'web'"):
        load_config(cfg)
    cfg.write_text("resources: [{resource: pods, namespace_selector: 'team in (pay'}]\n"
                   "sinks: [{name: s, kind: stdout}]\n")
    with pytest.raises(ConfigurationError, match=r"resources\.0\.namespace_selector: unable to parse"):
        load_config(cfg)
    # Two scopes of one resource that differ only by their namespace selector are two informers.
    cfg.write_text("resources: [{resource: pods, namespace_selector: team=pay},"
                   " {resource: pods, namespace_selector: team=web}]\nsinks: [{name: s, kind: stdout}]\n")
    assert len(load_config(cfg).resources) == 2


async def test_a_cluster_scoped_resource_cannot_have_a_namespace_selector(tmp_path: Path) -> None:
    async with Simulator() as sim:
        config = _config(sim, tmp_path, tmp_path / "e.jsonl", namespace_selector="team=pay")
        config = config.model_copy(update={"resources": [
            config.resources[0].model_copy(update={"resource": "nodes"})]})
        with pytest.raises(ConfigurationError,
                           match=r"resources\.0\.namespace_selector: nodes is cluster-scoped"):
            await BridgeService(config=config).run()


async def test_a_namespace_relabelled_while_the_bridge_was_down_is_caught_up_at_start(
        tmp_path: Path) -> None:
    """The bridge resumes from its checkpoint; the namespaces' labels changed meanwhile: its first
    watch ends at once and the resource is relisted, so the objects of the namespace that left
    leave (marked) and those of the one that entered enter."""
    async with Simulator(namespaces=("default", "a", "b")) as sim:
        client = ApiClient(server=sim.url)
        for ns, team in (("a", "pay"), ("b", "other")):
            await _label(client, ns, team)
            await client.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "cm"}})
        events = tmp_path / "events.jsonl"
        config = _config(sim, tmp_path, events, namespace_selector="team=pay")
        config = config.model_copy(update={"checkpoint": config.checkpoint.model_copy(update={
            "store": "file", "directory": str(tmp_path / "checkpoints"), "interval": 0.1})})
        try:
            for step in range(2):
                service = BridgeService(config=config)
                task = asyncio.create_task(service.run(), name=f"service-{step}")
                try:
                    await eventually(functools.partial(_ready, service), what="readiness")
                    if step == 0:
                        await eventually(lambda: _seen(events) == [("added", "a/cm", None)],
                                         what="a's object")
                        await asyncio.sleep(0.5)  # a checkpoint written
                    else:
                        await eventually(lambda: len(_seen(events)) == 3, what="the catch-up")
                finally:
                    service.stop_event.set()
                    await task
                if step == 0:
                    await _label(client, "a", "none")
                    await _label(client, "b", "pay")
        finally:
            await client.close()
    assert sorted(_seen(events)[1:]) == [("added", "b/cm", None), ("deleted", "a/cm", "true")]
