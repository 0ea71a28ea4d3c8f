"""/metrics of a running sharded service, read over HTTP: once the shard is resolved and handed to the
telemetry, every sample carries ``shard`` and ``total_shards`` (as kube-state-metrics' shards do) and
the shard gauges appear; before that, and in a replica that is not sharded, neither does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.kube.apiclient import ApiClient
from bridge.service.sharding_auto import resolve
from bridge.service.telemetry import Telemetry
from bridge.sim import Simulator
from bridge.sim.objects import make_pod
from tests.service.in_process import running_service, simulator_config
from tests.service.test_service import eventually, get, lines, metric
from tests.service.test_sharding_auto import Sharding, statefulset

pytestmark = pytest.mark.usefixtures("own_cwd")

SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$')


def samples(text: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))))
    return out


async def test_every_sample_of_a_running_shard_carries_its_shard_labels(tmp_path: Path) -> None:
    async with Simulator(namespaces=("default", "ops")) as sim:
        for i in range(3):
            sim.store.create("pods", make_pod(f"p{i}", "default"))
        sim.store.create("statefulsets.apps", statefulset("keb-kube-event-bridge", 3))
        config = simulator_config(sim, tmp_path, resources=[{"resource": "pods", "namespace": "default"}])
        async with running_service(config) as service:
            await eventually(lambda: service.readiness().ready, what="readiness")
            await eventually(lambda: len(lines(tmp_path / "events.jsonl")) == 3, what="3 events")
            base = f"http://127.0.0.1:{service.health.port}"
            status, before = await get(f"{base}/metrics")
            assert status == 200
            async with ApiClient(server=sim.url) as api:
                ordinal, total = await resolve(
                    Sharding(), api, environ={"POD_NAME": "keb-kube-event-bridge-1", "POD_NAMESPACE": "ops"})
            service.telemetry.set_shard(ordinal, total)
            status, text = await get(f"{base}/metrics")
            assert status == 200

    # Before the shard is known: no shard labels, no shard gauges.
    assert all("shard" not in labels and "total_shards" not in labels for _, labels in samples(before))
    assert "keb_shard_ordinal" not in before
    assert "keb_total_shards" not in before

    exposed = samples(text)
    names = {name for name, _ in exposed}
    assert {"keb_events_received_total", "keb_informer_cached_objects", "keb_sink_events_total",
            "keb_leader", "process_resident_memory_bytes", "python_gc_collections_total"} <= names
    unlabelled = [(name, labels) for name, labels in exposed
                  if labels.get("shard") != "1" or labels.get("total_shards") != "3"]
    assert unlabelled == []
    assert metric(text, "keb_shard_ordinal", shard="1", total_shards="3") == 1
    assert metric(text, "keb_total_shards", shard="1", total_shards="3") == 3
    # The other labels are untouched.
    assert metric(text, "keb_events_received_total", resource="pods", type="added", shard="1") == 3
    assert metric(text, "keb_leader", shard="1") == 1


def test_the_shard_never_changes_and_must_exist() -> None:
    telemetry = Telemetry()
    try:
        with pytest.raises(ValueError, match="need 0 <= ordinal < total"):
            telemetry.set_shard(3, 3)
        with pytest.raises(ValueError, match="need 0 <= ordinal < total"):
            telemetry.set_shard(0, 0)
        assert telemetry.shard is None
        telemetry.set_shard(0, 1)
        assert telemetry.shard == (0, 1)
        telemetry.set_shard(0, 1)  # again, the same shard (a pipeline started again): nothing changes
        with pytest.raises(RuntimeError, match=r"already set \(0 of 1\), not 1 of 2"):
            telemetry.set_shard(1, 2)
        assert telemetry.shard == (0, 1)
        text = telemetry.render_prometheus().decode()
        assert metric(text, "keb_total_shards", shard="0", total_shards="1") == 1
        assert metric(text, "keb_shard_ordinal", shard="0", total_shards="1") == 0
        # Scraping again does not stack the labels or lose them.
        again = telemetry.render_prometheus().decode()
        assert all(labels.get("shard") == "0" for _, labels in samples(again))
        assert all(line.count(' shard="0"') + line.count('{shard="0"') + line.count(',shard="0"') == 1
                   for line in again.splitlines() if line and not line.startswith("#"))
    finally:
        telemetry.shutdown()


def test_one_replicas_shard_labels_do_not_leak_into_another_telemetry() -> None:
    # Several services in one process (tests, in-process shards) share prometheus_client's process,
    # GC and platform collectors, one of which keeps its families between scrapes: labelling one
    # replica's exposition must not change what another exposes.
    sharded, plain, other = Telemetry(), Telemetry(), Telemetry()
    try:
        sharded.set_shard(1, 3)
        other.set_shard(0, 3)
        for _ in range(2):
            assert all(labels.get("shard") == "1"
                       for _, labels in samples(sharded.render_prometheus().decode()))
            assert all("shard" not in labels and "total_shards" not in labels
                       for _, labels in samples(plain.render_prometheus().decode()))
            assert all(labels.get("shard") == "0"
                       for _, labels in samples(other.render_prometheus().decode()))
    finally:
        for t in (sharded, plain, other):
            t.shutdown()
