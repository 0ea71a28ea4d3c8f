"""Workers (bridge/service/workers.py): how many, which shard each is, the pod's merged metrics, and
the supervisor's handling of real worker processes that exit. The whole thing under churn, with a
worker SIGKILLed and the count changed, is tests/checkpoint/test_workers_processes.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.errors import ConfigurationError
from bridge.service.config import BridgeConfig, load_config
from bridge.service.workers import (
    Supervisor,
    WorkerPosition,
    cpu_limit,
    for_worker,
    merge_metrics,
    resolve_workers,
    worker_position,
)
from tests.brokers import free_port
from tests.service.test_cli import run_cli
from tests.service.test_cli_errors import assert_config_error

BASE = "resources: [{resource: pods}]\nsinks: [{name: out, kind: file, path: /tmp/keb-w/events.jsonl}]\n"


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("files", "cpus", "expected"), [
    ({"cpu.max": "250000 100000\n"}, 8, 2),         # v2: 2.5 CPUs → 2
    ({"cpu.max": "50000 100000\n"}, 8, 1),          # half a CPU → at least 1
    ({"cpu.max": "max 100000\n"}, 6, 6),            # no limit → the CPUs it may run on
    ({"cpu.max": "1600000 100000\n"}, 4, 4),        # a limit above the CPUs → the CPUs
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8, 3),  # v1
    ({"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 5, 5),
    ({}, 3, 3),                                     # no cgroup files at all
])
def test_cpu_limit_from_cgroup_or_affinity(tmp_path: Path, files: dict[str, str], cpus: int,
                                           expected: int) -> None:
    assert cpu_limit(cgroup=_cgroup(tmp_path, files), affinity=lambda: cpus) == expected


def test_workers_setting_auto_and_numbers(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "workers: auto\n")
    assert resolve_workers(load_config(cfg), cpus=lambda: 4) == 4
    cfg.write_text(BASE + "workers: 3\n")
    assert resolve_workers(load_config(cfg), cpus=lambda: 4) == 3
    cfg.write_text(BASE)
    assert resolve_workers(load_config(cfg), cpus=lambda: 4) == 1  # unset: one process, as before


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5"])
def test_bad_workers_exit_2_naming_the_field(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + f"workers: {value}\n")
    for command in ("check-config", "run"):
        assert_config_error(run_cli(command, "--config", str(cfg)), "workers")


def test_worker_position_and_its_shard() -> None:
    assert worker_position({}) is None
    pos = worker_position({"KUBE_EVENT_BRIDGE_WORKER": "2/3"})
    assert pos == WorkerPosition(index=2, count=3)
    # Replica 1 of 4, worker 2 of 3: shard 1*3 + 2 of 12.
    assert pos.shard(1, 4) == (5, 12)
    # The workers of all replicas cover every shard of the total exactly once.
    assert sorted(WorkerPosition(index=w, count=3).shard(r, 4) for r in range(4) for w in range(3)) == [
        (s, 12) for s in range(12)]
    for bad in ("3/3", "x", "1/0"):
        with pytest.raises(ConfigurationError, match="KUBE_EVENT_BRIDGE_WORKER"):
            worker_position({"KUBE_EVENT_BRIDGE_WORKER": bad})


def test_each_worker_writes_a_file_sink_of_its_own() -> None:
    config = BridgeConfig.model_validate({"resources": [{"resource": "pods"}], "sinks": [
        {"name": "out", "kind": "file", "path": "/data/events.jsonl", "fsync": "batch"},
        {"name": "hook", "kind": "webhook", "url": "http://h.example.com/"}]})
    mine = for_worker(config, WorkerPosition(index=1, count=2))
    assert mine.sinks[0].options() == {"path": "/data/events.worker-1.jsonl", "fsync": "batch"}
    assert mine.sinks[1] == config.sinks[1]
    assert for_worker(config, WorkerPosition(index=0, count=1)) is config


W0 = """# HELP keb_events_total Events delivered.
# TYPE keb_events_total counter
keb_events_total{sink="a",shard="0"} 5.0
# HELP keb_lag_seconds Lag.
# TYPE keb_lag_seconds histogram
keb_lag_seconds_bucket{le="1.0",shard="0"} 1.0
keb_lag_seconds_bucket{le="+Inf",shard="0"} 2.0
keb_lag_seconds_sum{shard="0"} 3.0
keb_lag_seconds_count{shard="0"} 2.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total 7.0
"""


def test_merged_metrics_are_one_valid_exposition_with_a_worker_label() -> None:
    w1 = W0.replace('shard="0"', 'shard="1"').replace("5.0", "9.0")
    merged = merge_metrics({0: W0, 1: w1})
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    events = families["keb_events"]
    assert sorted((s.labels["worker"], s.labels["shard"], s.value) for s in events.samples) == [
        ("0", "0", 5.0), ("1", "1", 9.0)]
    lag = families["keb_lag_seconds"]
    assert {s.labels["worker"] for s in lag.samples if s.name == "keb_lag_seconds_count"} == {"0", "1"}
    # Series without labels of their own (the runtime's) stay apart per worker.
    gc = families["python_gc_objects_collected"]
    assert sorted(s.labels["worker"] for s in gc.samples) == ["0", "1"]
    assert merged.count("# TYPE keb_lag_seconds histogram") == 1


def _config(tmp_path: Path) -> BridgeConfig:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + f"server: {{host: 127.0.0.1, port: {free_port()}, admin_port: {free_port()}}}\n"
                   "shutdown_deadline: 3\n")
    return load_config(cfg)


async def test_a_worker_exiting_with_a_configuration_error_stops_the_supervisor_with_2(
        tmp_path: Path) -> None:
    sup = Supervisor(config=_config(tmp_path), workers=2,
                     command=[sys.executable, "-c", "raise SystemExit(2)"])
    assert await asyncio.wait_for(sup.run(), 30) == 2


async def test_a_worker_that_exits_is_restarted_alone_and_the_pod_is_unready_meanwhile(
        tmp_path: Path) -> None:
    # Worker 1 exits at once every time; worker 0 runs until told to stop.
    script = ("import os, signal, sys, time\n"
              "if os.environ['KUBE_EVENT_BRIDGE_WORKER'].startswith('1/'): sys.exit(1)\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
              "time.sleep(60)\n")
    config = _config(tmp_path)
    sup = Supervisor(config=config, workers=2, command=[sys.executable, "-c", script])
    task = asyncio.create_task(sup.run())
    try:
        async with aiohttp.ClientSession() as http:
            deadline = asyncio.get_running_loop().time() + 30
            restarts: dict[str, int] = {}
            while asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
                try:
                    async with http.get(f"http://127.0.0.1:{config.server.port}/metrics") as r:
                        text = await r.text()
                except aiohttp.ClientError:
                    continue
                restarts = {s.labels["worker"]: int(s.value)
                            for f in text_string_to_metric_families(text)
                            for s in f.samples if s.name == "keb_worker_restarts_total"}
                if restarts.get("1", 0) >= 2:
                    break
            assert restarts.get("1", 0) >= 2, restarts
            assert restarts["0"] == 0, restarts
            async with http.get(f"http://127.0.0.1:{config.server.port}/readyz") as r:
                body = await r.json()
                assert r.status == 503
                assert any(reason.startswith("worker 1:") for reason in body["reasons"]), body
                assert body["workers"][0]["pid"] is not None
    finally:
        sup.stop_event.set()
        # 0, or 1 when the failing worker 1 had just been started again and exited by itself.
        assert await asyncio.wait_for(task, 30) in (0, 1)
        assert sup._workers[0].proc is not None
        assert sup._workers[0].proc.returncode == 0  # worker 0 was asked to stop, and did
