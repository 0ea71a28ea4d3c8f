"""An object that leaves a label selector arrives as ``deleted`` (it left the informer's view) with
``leftselector: "true"``; a real delete has no such mark. End to end against the simulator, whose
selector-scoped watches report an exit as the API server's watch cache does (DELETED, the previous
content at the new resourceVersion)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.sim import Simulator
from tests.service.in_process import running_service
from tests.service.test_service import eventually, lines

pytestmark = pytest.mark.usefixtures("own_cwd")


def _pod(name: str, app: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}


def _config(sim: Simulator, tmp_path: Path, events: Path, resource: dict[str, Any],
            **more: Any) -> BridgeConfig:
    """A bridge watching ``resource`` on ``sim``, writing to the file ``events``, without
    checkpoints; ``more``: other top-level settings."""
    return BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
                       "in_cluster": "false"},
        "resources": [resource],
        "sinks": [{"name": "file", "kind": "file", "path": str(events)}],
        "checkpoint": {"store": "none"},
        **more,
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 10,
    })


async def _add_two_pods_once_ready(service: BridgeService, session: aiohttp.ClientSession, base: str,
                        events: Path, names: tuple[str, str]) -> None:
    """Once the bridge is ready, creates the two Pods (label ``app=web``) and waits for their adds."""
    await eventually(lambda: service.readiness().ready, what="readiness")
    for name in names:
        async with session.post(base, json=_pod(name, "web")) as r:
            assert r.status == 201
    await eventually(lambda: len(lines(events)) == 2, what="the adds")


async def test_a_selector_exit_is_a_marked_delete_and_a_real_delete_is_not(tmp_path: Path) -> None:
    async with Simulator() as sim:
        events = tmp_path / "events.jsonl"
        config = _config(sim, tmp_path, events, {"resource": "pods", "label_selector": "app=web"})
        base = f"{sim.url}/api/v1/namespaces/default/pods"
        async with running_service(config, exit_code=None) as service, aiohttp.ClientSession() as s:
            await _add_two_pods_once_ready(service, s, base, events, ("moves", "goes"))
            async with s.patch(f"{base}/moves", json={"metadata": {"labels": {"app": "other"}}},
                               headers={"Content-Type": "application/merge-patch+json"}) as r:
                assert r.status == 200
            await eventually(lambda: len(lines(events)) == 3, what="the exit")
            async with s.delete(f"{base}/goes") as r:
                assert r.status == 200
            await eventually(lambda: len(lines(events)) == 4, what="the delete")
    got = [(e["type"].rsplit(".", 1)[1], e["name"], e.get("leftselector")) for e in lines(events)]
    assert got == [("added", "moves", None), ("added", "goes", None),
                   ("deleted", "moves", "true"), ("deleted", "goes", None)]


async def test_one_question_per_change_whatever_the_number_of_sinks_and_errors_read_as_deletes() -> None:
    from bridge.delivery.selector_exit import SelectorExits
    from bridge.errors import ForbiddenError, NotFoundError

    asked: list[str] = []
    answers: dict[str, Any] = {
        "exists": {"metadata": {"uid": "u1"}},
        "recreated": {"metadata": {"uid": "another"}},
        "gone": NotFoundError("not found", code=404),
        "forbidden": ForbiddenError("forbidden", code=403),
    }

    async def fetch(namespace: str, name: str, at: str) -> dict[str, Any]:
        if at:  # the names gone now were gone at their delete too
            raise NotFoundError("not found", code=404)
        asked.append(name)
        await asyncio.sleep(0.01)
        answer = answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    exits = SelectorExits(fetch=fetch)
    three = await asyncio.gather(*(exits.left("d", "exists", "u1", "7") for _ in range(3)))
    assert three == [True, True, True]
    assert asked == ["exists"]
    assert not await exits.left("d", "recreated", "u1", "8")  # same name, another object
    assert not await exits.left("d", "gone", "u1", "9")
    assert not await exits.left("d", "forbidden", "u1", "10")  # unknown: a delete is the safe reading


async def test_whether_a_uid_lives_on_is_asked_once_for_every_sink_and_retried_while_it_cannot_be_told(
) -> None:
    """After a restart the replayed history of a uid whose inferred delete was sent depends on whether
    it lives on: every sink's listener must read it alike, so the question is asked once per uid.
    An error is retried; one that lasts is read as gone."""
    from bridge.delivery.selector_exit import SelectorExits
    from bridge.errors import NotFoundError, ServerError

    asked: list[str] = []
    failures = {"flaky": 2, "down": 99}

    async def fetch(namespace: str, name: str, at: str) -> dict[str, Any]:
        asked.append(name)
        await asyncio.sleep(0)
        if failures.get(name, 0) > 0:
            failures[name] -= 1
            raise ServerError("unavailable", code=503)
        if name == "gone":
            raise NotFoundError("not found", code=404)
        if name == "recreated":
            return {"metadata": {"uid": "another", "resourceVersion": "12"}}
        return {"metadata": {"uid": f"u-{name}", "resourceVersion": "42"}}

    exits = SelectorExits(fetch=fetch, attempts=3, retry_delay=0)
    assert await asyncio.gather(*(exits.alive("d", "lives", "u-lives") for _ in range(3))) == [42, 42, 42]
    assert await exits.alive("d", "lives", "u-lives") == 42
    assert asked == ["lives"]
    assert await exits.alive("d", "gone", "u2") is None
    assert await exits.alive("d", "recreated", "u3") is None  # the name holds another uid
    assert await exits.alive("d", "flaky", "u-flaky") == 42  # two 503s, then an answer
    assert await exits.alive("d", "down", "u4") is None  # no answer in three attempts: gone
    assert asked.count("flaky") == 3
    assert asked.count("down") == 3


async def test_a_cancelled_asker_of_whether_a_uid_lives_on_leaves_the_question_to_the_others() -> None:
    from bridge.delivery.selector_exit import SelectorExits

    release = asyncio.Event()
    asked: list[str] = []

    async def fetch(namespace: str, name: str, at: str) -> dict[str, Any]:
        asked.append(name)
        await release.wait()
        return {"metadata": {"uid": "u1", "resourceVersion": "7"}}

    exits = SelectorExits(fetch=fetch)
    first = asyncio.create_task(exits.alive("d", "x", "u1"), name="first-asker")
    await asyncio.sleep(0)
    second = asyncio.create_task(exits.alive("d", "x", "u1"), name="second-asker")
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    release.set()
    assert await second == 7
    assert first.cancelled()
    assert asked == ["x", "x"]  # the second asked again


async def test_a_pod_bound_then_deleted_before_the_question_is_answered_is_still_handed_over_marked(
        tmp_path: Path) -> None:
    """The owner of unscheduled Pods (``sharding.strategy: node``) sees a binding as a delete at the
    binding's resourceVersion. When the Pod is deleted (from its node) before the owner asks about that
    delete, as a loaded owner can, the Pod is gone by the time of the question; it still outlived the
    binding, so the hand-over is marked. A Pod deleted before it was bound is a plain delete."""
    async with Simulator() as sim:
        events = tmp_path / "events.jsonl"
        config = _config(sim, tmp_path, events, {"resource": "pods", "namespace": "default"},
                         sharding={"strategy": "node", "unscheduled": True})
        base = f"{sim.url}/api/v1/namespaces/default/pods"
        async with running_service(config, exit_code=None) as service, aiohttp.ClientSession() as s:
            await _add_two_pods_once_ready(service, s, base, events, ("bound", "unbound"))
            sim.set_faults(watch_stall=True)  # the owner has not read the binding yet
            async with s.post(f"{base}/bound/binding", json={
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"},
                    "target": {"kind": "Node", "name": "node-a"}}) as r:
                assert r.status == 201
            for name in ("bound", "unbound"):
                async with s.delete(f"{base}/{name}") as r:
                    assert r.status == 200
            sim.set_faults(watch_stall=False)
            await eventually(lambda: len(lines(events)) == 4, what="the exit and the delete")
    got = [(e["type"].rsplit(".", 1)[1], e["name"], e.get("leftselector")) for e in lines(events)]
    assert got == [("added", "bound", None), ("added", "unbound", None),
                   ("deleted", "bound", "true"), ("deleted", "unbound", None)]
