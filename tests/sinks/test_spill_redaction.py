"""A sink's spill holds what the sink would send, after redaction: a watched Secret's values never
reach the spill volume, not even while the sink is stuck and its backlog goes to disk.

Real components: the API-server simulator over real HTTP (Secrets watched through the service's
list/watch wiring), a real webhook sink posting to a local HTTP receiver that hangs until released,
and the sink's real segment spill on disk."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.delivery.pipeline import BridgePipeline
from bridge.kube.apiclient import ApiClient
from bridge.rawobject import RawObject
from bridge.sim import Simulator
from bridge.storage.checkpoint import FileCheckpointStore
from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.contract import ResourceRef
from sinks.redaction import REDACTED, Redactor, keyed_mark
from sinks.webhook import WebhookSink
from tests.checkpoint.helpers import simulated_cluster, until, watched_over_http

NS = "vault"
SECRETS = 40


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Simulator, ApiClient]]:
    async with simulated_cluster(tmp_path, NS, bookmark_interval=0.5) as world:
        yield world


class HangingReceiver:
    """A webhook receiver (the kit's) whose requests wait until :attr:`release` is set, then answer
    200."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0
        self.events: list[dict[str, Any]] = []
        self._hook = WebhookReceiver(path="/in", respond=self._respond)
        self.url = ""

    async def _respond(self, request: ReceivedRequest) -> Reply:
        self.waiting += 1
        await self.release.wait()
        self.events.append(orjson.loads(request.body))
        return Reply(200)

    async def start(self) -> None:
        await self._hook.start()
        self.url = self._hook.url

    async def stop(self) -> None:
        self.release.set()
        await self._hook.close()


def value_of(i: int) -> str:
    return f"hunter2-topsecret-{i:04d}-value"


ROTATED = "hunter2-topsecret-0000"
"""s0's password after a change of its data alone (its annotation still holds it)."""


async def test_a_stuck_sink_spills_secrets_redacted(sim: tuple[Simulator, ApiClient], tmp_path: Path) -> None:
    _, client = sim
    receiver = HangingReceiver()
    await receiver.start()
    sink = WebhookSink.from_options("hook", {
        "url": receiver.url, "timeout": 120, "connections": 1, "max_in_flight": 1,
        "buffer": {"capacity": 2}, "retry": {"max_attempts": 0}})
    factory, watched = await watched_over_http(client, "secrets", "Secret", NS)
    spill = tmp_path / "spill"
    p = BridgePipeline(factory=factory, resources=[watched],
                       sinks=[sink], checkpoint_store=FileCheckpointStore(directory=tmp_path / "cp"),
                       checkpoint_interval=0.2, cluster="sim", spill_directory=spill)
    path = f"/api/v1/namespaces/{NS}/secrets"
    await client.create(path, {"metadata": {"name": "first"}, "data": {"k": "dg=="}})
    try:
        await p.start()
        assert await p.wait_for_sync(10)
        await until(lambda: receiver.waiting == 1, what="the first request hanging")
        for i in range(SECRETS):
            await client.create(path, {"metadata": {"name": f"s{i}", "annotations": {"note": value_of(i)}},
                                       "data": {"password": base64.b64encode(value_of(i).encode()).decode()},
                                       "stringData": {"token": f"tok-{value_of(i)}"}})
        # A change of the data alone, while the sink is stuck: it must still go out (the spill keeps
        # marks that differ where the values differ, not one placeholder for all).
        changed = await client.patch(f"{path}/s0", {"data": {
            "password": base64.b64encode(ROTATED.encode()).decode()}})
        # The values are in the cluster...
        stored = await client.get(f"{path}/s7")
        assert base64.b64decode(stored["data"]["password"]).decode() == value_of(7)
        # ...and the backlog is on disk.
        await until(lambda: p.sink_backlog("hook").spilled >= SECRETS - 4, what="the backlog spilled")
        assert p.sink_backlog("hook").spill_bytes > 0
        for segment in spill.rglob("*"):
            if not segment.is_file():
                continue
            data = segment.read_bytes()
            for i in range(SECRETS):
                for needle in (value_of(i), base64.b64encode(value_of(i).encode()).decode(),
                               ROTATED, base64.b64encode(ROTATED.encode()).decode()):
                    assert needle.encode() not in data, (segment, needle)

        receiver.release.set()
        await until(lambda: len(receiver.events) >= SECRETS + 2, 30, "every change delivered")
        updates = [e for e in receiver.events if e["data"]["metadata"]["name"] == "s0"]
        assert [u["data"]["metadata"]["resourceVersion"] for u in updates][-1] == \
            changed["metadata"]["resourceVersion"]
        seen: dict[str, dict[str, Any]] = {}
        for event in receiver.events:
            obj = event.get("data") or {}
            name = (obj.get("metadata") or {}).get("name")
            if name:
                seen[name] = obj
        assert sorted(seen) == sorted(["first", *(f"s{i}" for i in range(SECRETS))])
        seen.pop("first")
        for name, obj in seen.items():
            assert obj["data"]["password"] == REDACTED, name
            assert obj["metadata"]["annotations"]["note"] == REDACTED, name
            assert "hunter2" not in orjson.dumps(obj).decode(), name
    finally:
        await p.shutdown(5)
        await receiver.stop()


# --- the spill form itself ---------------------------------------------------------------------------

SECRET_REF = ResourceRef(group="", version="v1", resource="secrets", kind="Secret")
PODS_REF = ResourceRef(group="", version="v1", resource="pods", kind="Pod")


def secret(password: str, **annotations: str) -> dict[str, Any]:
    encoded = base64.b64encode(password.encode()).decode()
    applied = orjson.dumps({"kind": "Secret", "data": {"password": encoded}})
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": NS, "resourceVersion": "7",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied.decode(),
                                         **annotations}},
            "data": {"password": base64.b64encode(password.encode()).decode()},
            "stringData": {"extra": password}}


@pytest.mark.parametrize(("obj", "ref", "paths"), [
    (secret("p4ss-one", note="uses p4ss-one"), SECRET_REF, ()),
    (RawObject(orjson.dumps(secret("p4ss-one"))), SECRET_REF, ()),
    ({"metadata": {"name": "p", "annotations": {"token": "abc"}}, "spec": {"env": ["x", "y"]}}, PODS_REF,
     ("metadata.annotations.token", "spec.env")),
])
def test_the_sink_sends_the_same_from_the_spill_form(obj: Any, ref: ResourceRef,
                                                     paths: tuple[str, ...]) -> None:
    redactor = Redactor(redact_paths=paths)
    mark = keyed_mark(b"k" * 32)
    form = redactor.spill_form(obj, ref, mark)
    assert redactor.apply(form, ref) == redactor.apply(obj, ref)
    text = orjson.dumps(dict(form)).decode()
    for hidden in ("p4ss-one", base64.b64encode(b"p4ss-one").decode(), '"abc"'):
        assert hidden not in text


def test_the_spill_form_tells_different_values_apart_and_hides_them_from_another_key() -> None:
    redactor = Redactor()
    mark = keyed_mark(b"k" * 32)
    one, two = (redactor.spill_form(secret(p), SECRET_REF, mark) for p in ("p4ss-one", "p4ss-two"))
    assert one["data"] != two["data"]
    assert redactor.apply(one, SECRET_REF)["data"] == redactor.apply(two, SECRET_REF)["data"]  # type: ignore[index]
    # The marks depend on the process's key: a value cannot be checked against them without it.
    other = redactor.spill_form(secret("p4ss-one"), SECRET_REF, keyed_mark(b"x" * 32))
    assert other["data"] != one["data"]
