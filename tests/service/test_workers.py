"""Workers (bridge/service/workers.py): how many, which shard each is, the pod's merged metrics, and
the supervisor's handling of real worker processes that exit. The whole thing under churn, with a
worker SIGKILLed and the count changed, is tests/checkpoint/test_workers_processes.py."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.errors import ConfigurationError
from bridge.service import workers as workers_module
from bridge.service.config import BridgeConfig, load_config
from bridge.service.workers import (
    CGROUP_ENV,
    Supervisor,
    WorkerPosition,
    cgroup_cpu_quota,
    cpu_limit,
    default_workers,
    for_worker,
    merge_metrics,
    resolve_workers,
    worker_position,
)
from bridge.testing.processes import ServiceProcess, wait_until
from tests.service.test_cli import run_cli, sim_process  # noqa: F401 - the fixture
from tests.service.test_cli_errors import assert_config_error

pytestmark = pytest.mark.usefixtures("own_cwd")

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


V1 = "cpu,cpuacct"


@pytest.mark.parametrize(("files", "quota"), [
    ({"cpu.max": "200000 100000\n"}, 2.0),                # cgroup v2, as the kernel writes it
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "50000 100000\n"}, 0.5),
    ({"cpu.max": "max 100000\n"}, None),                  # v2 without a limit
    ({f"{V1}/cpu.cfs_quota_us": "300000\n", f"{V1}/cpu.cfs_period_us": "100000\n"}, 3.0),  # v1
    ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),
    ({f"{V1}/cpu.cfs_quota_us": "-1\n", f"{V1}/cpu.cfs_period_us": "100000\n"}, None),  # v1, no limit
    ({"cpu.max": "garbage\n"}, None),
    ({}, None),                                           # no cgroup files at all
])
def test_cgroup_cpu_quota_from_real_format_files(tmp_path: Path, files: dict[str, str],
                                                 quota: float | None) -> None:
    assert cgroup_cpu_quota(_cgroup(tmp_path, files)) == quota


@pytest.mark.parametrize(("files", "cpus", "expected"), [
    ({"cpu.max": "200000 100000\n"}, 8, 2),
    ({"cpu.max": "150000 100000\n"}, 8, 1),         # 1.5 CPUs → 1
    ({"cpu.max": "50000 100000\n"}, 8, 1),          # half a CPU → at least 1
    ({"cpu.max": "250000 100000\n"}, 8, 2),         # 2.5 → 2
    ({"cpu.max": "1600000 100000\n"}, 4, 4),        # a limit above the CPUs → the CPUs
    ({"cpu.max": "max 100000\n"}, 8, 1),            # no limit → 1, whatever the CPUs
    ({f"{V1}/cpu.cfs_quota_us": "400000\n", f"{V1}/cpu.cfs_period_us": "100000\n"}, 8, 4),
    ({f"{V1}/cpu.cfs_quota_us": "-1\n", f"{V1}/cpu.cfs_period_us": "100000\n"}, 8, 1),
    ({}, 8, 1),
])
def test_default_workers_are_the_cpu_limit_rounded_down_or_1(tmp_path: Path, files: dict[str, str],
                                                              cpus: int, expected: int) -> None:
    assert default_workers(cgroup=_cgroup(tmp_path, files), affinity=lambda: cpus) == expected


def test_the_cgroup_root_can_be_moved_for_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CGROUP_ENV, str(_cgroup(tmp_path, {"cpu.max": "300000 100000\n"})))
    assert cgroup_cpu_quota() == 3.0


def test_workers_setting_auto_and_numbers(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "workers: auto\n")
    assert resolve_workers(load_config(cfg), cpus=lambda: 4, default=lambda: 3) == 4
    cfg.write_text(BASE + "workers: 3\n")
    assert resolve_workers(load_config(cfg), cpus=lambda: 4, default=lambda: 2) == 3
    cfg.write_text(BASE + "workers: 1\n")
    assert resolve_workers(load_config(cfg), cpus=lambda: 4, default=lambda: 2) == 1  # written wins
    cfg.write_text(BASE)
    assert load_config(cfg).workers is None
    assert resolve_workers(load_config(cfg), cpus=lambda: 4, default=lambda: 2) == 2  # unset: the limit


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5", "null"])
def test_bad_workers_exit_2_naming_the_field(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + f"workers: {value}\n")
    for command in ("check-config", "run"):
        assert_config_error(run_cli(command, "--config", str(cfg)), "workers")


def test_the_printed_configuration_loads_again_with_workers_unset(tmp_path: Path) -> None:
    """check-config prints the effective configuration; fed back, it must mean the same (workers
    unset stays unset: the CPU limit, and no shard take-over)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE)
    printed = run_cli("check-config", "--config", str(cfg))
    assert printed.returncode == 0, printed.stderr
    again = tmp_path / "again.yaml"
    again.write_text(printed.stdout)
    assert run_cli("check-config", "--config", str(again)).returncode == 0
    assert load_config(again).workers is None
    assert "workers" not in load_config(again).model_fields_set


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
    """The supervisor's listeners on ports the kernel picks, written to ``address.json``."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "server: {host: 127.0.0.1, port: 0, admin_port: 0, "
                   f"address_file: '{tmp_path / 'address.json'}'}}\nshutdown_deadline: 3\n")
    return load_config(cfg)


def _listening_port(address: Path) -> int:
    port: int = json.loads(address.read_bytes())["port"]
    return port


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
        address = Path(str(config.server.address_file))
        await wait_until(address.exists, timeout=30, what="the supervisor to listen")
        port = _listening_port(address)
        async with aiohttp.ClientSession() as http:
            deadline = asyncio.get_running_loop().time() + 30
            restarts: dict[str, int] = {}
            while asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
                try:
                    async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
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
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
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


def _run_config(tmp_path: Path, kubeconfig: Path, server: str, more: str) -> Path:
    """A ``kube-event-bridge run`` configuration: pods to a file, ports 0 (``server`` adds to the
    ``server`` section, ``more`` adds sections)."""
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text(
        f"kubernetes: {{kubeconfig: '{kubeconfig}', in_cluster: 'false'}}\n"
        "resources: [{resource: pods}]\n"
        f"sinks: [{{name: out, kind: file, path: '{tmp_path / 'events.jsonl'}'}}]\n"
        f"checkpoint: {{store: file, directory: '{tmp_path / 'cp'}', interval: 1, "
        f"spill_directory: '{tmp_path / 'spill'}'}}\n"
        f"server: {{host: 127.0.0.1, port: 0, admin_port: 0{server}}}\n"
        f"{more}shutdown_deadline: 10\n")
    return cfg


async def test_one_pod_two_workers_one_set_of_endpoints(
        tmp_path: Path, sim_process: tuple[str, Path]) -> None:  # noqa: F811
    """``kube-event-bridge run`` with ``workers: 2`` against the simulator: the pod's one /readyz,
    /metrics and admin listener (token checked by the supervisor) answer for both workers, and a
    snapshot asked of the pod is made by each worker for its own objects, in its own file."""
    _, kubeconfig = sim_process
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = _run_config(tmp_path, kubeconfig, f", admin_token_file: '{token}'", "workers: 2\n")
    log = tmp_path / "bridge.log"
    proc = ServiceProcess(config=cfg, log=log)
    await proc.start()
    try:
        # The address file is the supervisor's (the pod's listeners), not a worker's.
        address = await proc.wait_ready()
        assert address.pid == proc.pid
        admin = proc.admin_port
        answer = await proc.readyz()
        assert answer is not None
        body: dict[str, Any] = answer[1]
        assert body.get("ready") is True, body
        assert [w["worker"] for w in body["workers"]] == [0, 1]
        assert all(w["pid"] and w["pid"] != proc.pid for w in body["workers"])
        metrics = await proc.get("/metrics", timeout=10)
        assert metrics is not None
        families = {f.name: f for f in text_string_to_metric_families(metrics[1].decode())}
        shards = {(s.labels["worker"], s.value) for s in families["keb_shard_ordinal"].samples}
        assert shards == {("0", 0.0), ("1", 1.0)}
        assert {s.value for s in families["keb_total_shards"].samples} == {2.0}
        # The admin listener: the supervisor checks the token, then asks both workers.
        url = f"http://127.0.0.1:{admin}/snapshot?resource=pods"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.post(url) as r:
                assert r.status == 401
            async with http.post(url, headers={"Authorization": "Bearer s3cret"}) as r:
                assert r.status == 202
                # Each worker names the checkpoint id of the shard it snapshotted.
                done = json.loads(await r.read())["resources"]
        assert [d.rsplit(".", 1)[1] for d in done] == ["shard-0-of-2", "shard-1-of-2"]
        for w in (0, 1):
            path = tmp_path / f"events.worker-{w}.jsonl"
            ends: list[dict[str, Any]] = []

            def snapshot_ended(path: Path = path, ends: list[dict[str, Any]] = ends) -> bool:
                ends[:] = [e for e in map(json.loads, path.read_bytes().splitlines())
                           if e["type"].endswith("snapshot.end")]
                return bool(ends)

            await wait_until(snapshot_ended, timeout=30, what=f"worker {w}'s snapshot end", alive=proc)
            assert (ends[0]["shard"], ends[0]["totalshards"]) == (str(w), "2")
        assert await proc.stop(timeout=30) == 0
        # One log for the pod; each worker's records say whose they are.
        records = [json.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]
        # (Each worker logs its shard's share of the resources before it starts its pipeline.)
        assert {r.get("worker") for r in records if r["logger"] == "bridge.service.replica_share"} == {0, 1}
        assert any("supervising 2 workers" in r["message"] for r in records if "worker" not in r)
    finally:
        await proc.kill()


async def test_a_workers_port_taken_before_it_binds_does_not_stop_it(
        tmp_path: Path, sim_process: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The supervisor used to pick each worker's private ports (bind port 0, close) and hand the
    numbers to the worker, which bound them later: a process taking one in between made the worker
    exit with "address already in use" (and again at every restart). Here every port so picked is
    taken before the worker starts; the workers bind port 0 themselves and report what they got."""
    _, kubeconfig = sim_process
    picked = getattr(workers_module, "_free_port", None)
    taken: list[socket.socket] = []

    def picked_and_taken() -> int:
        assert picked is not None
        port: int = picked()
        thief = socket.socket()
        thief.bind(("127.0.0.1", port))
        thief.listen()
        taken.append(thief)
        return port

    monkeypatch.setattr(workers_module, "_free_port", picked_and_taken, raising=False)
    cfg = _run_config(tmp_path, kubeconfig, "", "workers: 2\n")
    sup = Supervisor(config=load_config(cfg), workers=2,
                     command=[sys.executable, "-m", "bridge.service.cli", "run", "--config", str(cfg)])
    task = asyncio.create_task(sup.run())
    body: dict[str, object] = {}

    async def ready_or_restarted() -> bool:
        if not sup._workers:  # not yet started
            return task.done()
        body.update((await sup.readiness())[0])
        return body["ready"] is True or any(w.restarts for w in sup._workers) or task.done()

    try:
        await wait_until(ready_or_restarted, timeout=60, what="both workers ready")
        assert [w.restarts for w in sup._workers] == [0, 0], body
        assert body["ready"] is True, body
        ports = {p for w in sup._workers for p in (w.port, w.admin_port)}
        assert len(ports) == 4, ports
        assert not ports & {s.getsockname()[1] for s in taken}, ports
        metrics = await sup.metrics()
        assert 'keb_worker_up{worker="0"} 1' in metrics
        assert 'keb_worker_up{worker="1"} 1' in metrics
    finally:
        sup.stop_event.set()
        code = await asyncio.wait_for(task, 60)
        for s in taken:
            s.close()
    assert code == 0


@pytest.mark.parametrize("cpu_max", ["200000 100000", "max 100000"])
async def test_unset_workers_start_as_many_as_the_cpu_limit(
        tmp_path: Path, sim_process: tuple[str, Path], cpu_max: str) -> None:  # noqa: F811
    """``kube-event-bridge run`` without ``workers``, its cgroup a fake one: under a limit of 2 CPUs
    the supervisor runs the default number of workers (2 on a machine with 2 CPUs or more); without a
    limit the process is the bridge itself, no supervisor."""
    _, kubeconfig = sim_process
    cgroup = _cgroup(tmp_path / "cgroup", {"cpu.max": cpu_max + "\n"})
    expected = default_workers(cgroup=cgroup)
    assert expected == (1 if cpu_max.startswith("max") else min(2, len(os.sched_getaffinity(0))))
    cfg = _run_config(tmp_path, kubeconfig, "", "")
    proc = ServiceProcess(config=cfg, log=tmp_path / "bridge.log", env={CGROUP_ENV: str(cgroup)})
    await proc.start()
    try:
        await proc.wait_ready()
        answer = await proc.readyz()
        assert answer is not None
        body: dict[str, Any] = answer[1]
        assert body.get("ready") is True, body
        if expected == 1:
            assert "workers" not in body, body
            assert [p.name for p in os.scandir(tmp_path) if fnmatch.fnmatch(p.name, "events*.jsonl")] == [
                "events.jsonl"]
        else:
            assert [w["worker"] for w in body["workers"]] == list(range(expected))
            assert all(w["pid"] and w["pid"] != proc.pid for w in body["workers"])
            metrics = await proc.get("/metrics", timeout=10)
            assert metrics is not None
            families = {f.name: f for f in text_string_to_metric_families(metrics[1].decode())}
            assert [s.value for s in families["keb_workers"].samples] == [float(expected)]
        assert await proc.stop(timeout=30) == 0
    finally:
        await proc.kill()


async def test_workers_of_a_replica_are_its_nested_shards_each_with_its_own_lease(tmp_path: Path) -> None:
    """Replica 1 of 2 with two workers (in-process, as the supervisor would start them): the workers
    are shards 2 and 3 of 4, and with leader election each campaigns for its own Lease (whose term
    fences that shard's checkpoint writes, as for any shard; docs/sharding.md, "Workers")."""
    from bridge.kube.apiclient import ApiClient
    from bridge.service.service import BridgeService
    from bridge.sim import Simulator
    from tests.service.test_service import eventually
    from tests.service.test_sharding_service import config as sharded_config

    le = {"leader_election": {"enabled": True, "namespace": "default", "name": "keb", "identity": "x",
                              "lease_duration": 3, "renew_deadline": 2, "retry_period": 0.5}}
    async with Simulator() as sim:
        services = [BridgeService(config=sharded_config(sim, tmp_path, 1, **le),
                                  worker=WorkerPosition(index=w, count=2)) for w in range(2)]
        tasks = [asyncio.create_task(s.run(), name=f"worker-{w}") for w, s in enumerate(services)]
        client = ApiClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
        try:
            await eventually(lambda: all(s.readiness().ready and s.readiness().role == "leader"
                                         for s in services), what="both workers lead")
            path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
            held = {o: (await client.get(f"{path}/keb-shard-{o}"))["spec"]["holderIdentity"]
                    for o in (2, 3)}
            leases = {item["metadata"]["name"] for item in (await client.get(path))["items"]}
        finally:
            for s in services:
                s.stop_event.set()
            await asyncio.gather(*tasks)
            await client.close()
    assert [s.shard for s in services] == [(2, 4), (3, 4)]
    assert held == {2: "x", 3: "x"}
    assert leases == {"keb-shard-2", "keb-shard-3"}
