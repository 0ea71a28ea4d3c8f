"""Automatic sharding against the simulator over real HTTP: the ordinal from the pod name, the number
of shards from the StatefulSet's spec.replicas, and a configuration error naming the field for
everything that cannot work (no ordinal, no StatefulSet, RBAC, an ordinal past the end)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import ConfigurationError, ServerError
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.service.sharding_auto import ShardingConfigError, pod_ordinal, resolve
from bridge.sim import Simulator

NS = "ops"


@dataclass(frozen=True)
class Sharding:
    """The configuration's ``sharding`` section, as the core's pydantic model carries it."""

    shards: int | str = "auto"
    ordinal: int | str = "auto"
    strategy: str = "object"
    statefulset: str = ""
    namespace: str = ""


def statefulset(name: str, replicas: int | None, namespace: str = NS) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "serviceName": name,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "bridge", "image": "keb"}]}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def no_hostname() -> str:
    raise AssertionError("the hostname must not be read when POD_NAME is set")


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(namespaces=("default", NS)) as s:
        yield s


@pytest.fixture
async def api(sim: Simulator) -> AsyncIterator[ApiClient]:
    client = ApiClient(server=sim.url)
    try:
        yield client
    finally:
        await client.close()


POD = {"POD_NAME": "keb-kube-event-bridge-2", "POD_NAMESPACE": NS}


async def test_ordinal_from_the_pod_name_and_total_from_the_statefulset(
        sim: Simulator, api: ApiClient) -> None:
    sim.store.create("statefulsets.apps", statefulset("keb-kube-event-bridge", 3))
    before = sim.requests["get"]
    assert await resolve(Sharding(), api, environ=POD, hostname=no_hostname) == (2, 3)
    assert sim.requests["get"] == before + 1
    # A scale of the StatefulSet is a reshard: the next start reads the new total.
    sts = sim.store.get("statefulsets.apps", "keb-kube-event-bridge", namespace=NS)
    sts["spec"]["replicas"] = 5
    sim.store.update("statefulsets.apps", sts)
    assert await resolve(Sharding(), api, environ=POD, hostname=no_hostname) == (2, 5)


async def test_pod_name_from_the_hostname_and_namespace_from_the_service_account_file(
        sim: Simulator, api: ApiClient, tmp_path: Path) -> None:
    sim.store.create("statefulsets.apps", statefulset("bridge", 4))
    ns_file = tmp_path / "namespace"
    ns_file.write_text(f"{NS}\n")
    got = await resolve(Sharding(), api, environ={}, hostname=lambda: "bridge-0", namespace_file=ns_file)
    assert got == (0, 4)


async def test_named_statefulset_and_namespace_win_over_the_pod(sim: Simulator, api: ApiClient) -> None:
    sim.store.create("statefulsets.apps", statefulset("other", 2, namespace="default"))
    sharding = Sharding(statefulset="other", namespace="default")
    # The pod is keb-kube-event-bridge-2 in ops, but ordinal 2 of other's 2 shards does not exist.
    with pytest.raises(ShardingConfigError, match=r"^sharding\.ordinal: .*ordinal 2 .*\(2\)"):
        await resolve(sharding, api, environ=POD, hostname=no_hostname)
    assert await resolve(sharding, api, environ={"POD_NAME": "x-1"}, hostname=no_hostname) == (1, 2)


async def test_missing_replicas_default_to_one(sim: Simulator, api: ApiClient) -> None:
    sim.store.create("statefulsets.apps", statefulset("keb", None))
    assert await resolve(Sharding(), api, environ={"POD_NAME": "keb-0", "POD_NAMESPACE": NS}) == (0, 1)


async def test_pod_name_without_an_ordinal_is_a_config_error(sim: Simulator, api: ApiClient) -> None:
    before = dict(sim.requests)
    with pytest.raises(ShardingConfigError, match=r"^sharding\.ordinal: .*'keb-7d9f8-x2z' has none") as info:
        await resolve(Sharding(), api, environ={"POD_NAME": "keb-7d9f8-x2z", "POD_NAMESPACE": NS})
    assert isinstance(info.value, ConfigurationError)  # the CLI's exit 2
    # A fixed ordinal with shards: auto still needs a StatefulSet name.
    with pytest.raises(ShardingConfigError, match=r"^sharding\.statefulset: .*'my-deployment-abc'"):
        await resolve(Sharding(ordinal=0), api, environ={"POD_NAME": "my-deployment-abc"})
    assert dict(sim.requests) == before  # nothing was asked of the API server


async def test_missing_statefulset_is_a_config_error(api: ApiClient) -> None:
    with pytest.raises(ShardingConfigError,
                       match=r"^sharding\.shards: auto reads spec\.replicas of the StatefulSet "
                             r"ops/keb-kube-event-bridge, which does not exist"):
        await resolve(Sharding(), api, environ=POD, hostname=no_hostname)


async def test_forbidden_statefulset_names_the_missing_rbac_rule() -> None:
    async with Simulator(namespaces=("default", NS), forbidden=[("apps", "statefulsets")]) as sim:
        sim.store.create("statefulsets.apps", statefulset("keb-kube-event-bridge", 3))
        async with ApiClient(server=sim.url) as api:
            with pytest.raises(ShardingConfigError) as info:
                await resolve(Sharding(), api, environ=POD, hostname=no_hostname)
    text = str(info.value)
    assert text.startswith("sharding.shards: auto needs to read the StatefulSet ops/keb-kube-event-bridge, "
                           "and RBAC forbids it")
    assert ('{apiGroups: ["apps"], resources: ["statefulsets"], resourceNames: ["keb-kube-event-bridge"], '
            'verbs: ["get"]}') in text
    assert "namespace ops" in text


async def test_ordinal_past_the_statefulset_replicas_is_a_config_error(
        sim: Simulator, api: ApiClient) -> None:
    sim.store.create("statefulsets.apps", statefulset("keb-kube-event-bridge", 2))
    with pytest.raises(ShardingConfigError,
                       match=r"^sharding\.ordinal: this pod's ordinal 2 is not below the StatefulSet "
                             r"ops/keb-kube-event-bridge's spec\.replicas \(2\)"):
        await resolve(Sharding(), api, environ=POD, hostname=no_hostname)


async def test_unknown_namespace_is_a_config_error(api: ApiClient, tmp_path: Path) -> None:
    with pytest.raises(ShardingConfigError, match=r"^sharding\.namespace: "):
        await resolve(Sharding(), api, environ={"POD_NAME": "keb-0"}, namespace_file=tmp_path / "absent")


async def test_fixed_numbers_ask_nothing_of_the_api(sim: Simulator, api: ApiClient) -> None:
    before = dict(sim.requests)
    assert await resolve(Sharding(shards=4, ordinal=3), api, environ={}, hostname=no_hostname) == (3, 4)
    assert await resolve(Sharding(shards=1, ordinal=0), api, environ={}, hostname=no_hostname) == (0, 1)
    # shards fixed, ordinal from the pod name
    assert await resolve(Sharding(shards=3), api, environ={"POD_NAME": "keb-1"}) == (1, 3)
    assert dict(sim.requests) == before
    with pytest.raises(ShardingConfigError, match=r"^sharding\.ordinal: the ordinal 4 must be below "
                                                  r"sharding\.shards \(4\)"):
        await resolve(Sharding(shards=4, ordinal=4), api, environ={})
    with pytest.raises(ShardingConfigError, match=r"^sharding\.shards: the ordinal 3 \(from the pod name "
                                                  r"'keb-3'\) must be below sharding\.shards \(3\)"):
        await resolve(Sharding(shards=3), api, environ={"POD_NAME": "keb-3"})
    with pytest.raises(ShardingConfigError, match=r"^sharding\.shards: must be 1 or more"):
        await resolve(Sharding(shards=0, ordinal=0), api, environ={})
    with pytest.raises(ShardingConfigError, match=r"^sharding\.ordinal: must be 0 or more"):
        await resolve(Sharding(shards=2, ordinal=-1), api, environ={})
    with pytest.raises(ShardingConfigError, match=r"^sharding\.shards: expected an integer or 'auto'"):
        await resolve(Sharding(shards="many", ordinal=0), api, environ={})


async def test_other_api_failures_are_not_config_errors(sim: Simulator) -> None:
    # A server that fails is not the configuration's fault: the error goes up as it is (exit 1, and
    # the pod is restarted), not as a configuration error.
    sim.store.create("statefulsets.apps", statefulset("keb-kube-event-bridge", 3))
    sim.faults.amend({"error_code": 500, "error_count": 1, "error_retry_after": 0})
    async with ApiClient(server=sim.url, options=ApiClientOptions(max_retries=0)) as api:
        with pytest.raises(ServerError) as info:
            await resolve(Sharding(), api, environ=POD, hostname=no_hostname)
        assert not isinstance(info.value, ConfigurationError)
        assert await resolve(Sharding(), api, environ=POD, hostname=no_hostname) == (2, 3)


def test_pod_ordinal() -> None:
    assert pod_ordinal("keb-0") == ("keb", 0)
    assert pod_ordinal("keb-kube-event-bridge-12") == ("keb-kube-event-bridge", 12)
    assert pod_ordinal("keb") is None
    assert pod_ordinal("keb-") is None
    assert pod_ordinal("keb-01") is None  # a StatefulSet never pads its ordinals
    assert pod_ordinal("-3") is None


OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


async def test_the_documented_messages_are_the_ones_given(sim: Simulator, api: ApiClient) -> None:
    doc = OPERATIONS.read_text()
    section = doc[doc.index("**Automatic sharding.**"):doc.index("**RBAC.**")]
    documented = re.findall(r"^\| [^|]+ \| `([^`]+)`", section, re.M)
    assert len(documented) == 5

    async def message(sharding: Sharding, environ: dict[str, str], client: ApiClient = api) -> str:
        with pytest.raises(ShardingConfigError) as info:
            await resolve(sharding, client, environ=environ, hostname=no_hostname)
        return str(info.value)

    given = [
        await message(Sharding(), {"POD_NAME": "keb-7d9f8-x2z", "POD_NAMESPACE": NS}),
        await message(Sharding(), POD),
        await message(Sharding(shards=2, ordinal=2), {}),
    ]
    sim.store.create("statefulsets.apps", statefulset("keb-kube-event-bridge", 2))
    given.append(await message(Sharding(), POD))
    async with Simulator(namespaces=("default", NS), forbidden=[("apps", "statefulsets")]) as denying:
        client = ApiClient(server=denying.url)
        try:
            given.append(await message(Sharding(), POD, client))
        finally:
            await client.close()
    for text in documented:
        pattern = re.escape(text).replace("…", ".*")
        pattern = re.sub(r"<[a-z]+>", r"\\S+?", pattern.replace(r"\<", "<").replace(r"\>", ">"))
        assert any(re.match(pattern, g) for g in given), (text, given)
