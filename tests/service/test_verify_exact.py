"""``kube-event-bridge verify`` compares the values a sink holds with the cluster's, exactly.

An object alive in the sink and in the cluster at the same resourceVersion is *altered* when a value
the sink holds is not the cluster's: an integer beyond 2^53 or 64 bits (which the bridge keeps
exact, decoding with msgspec) rounded by a sink, a string cut. Both sides are decoded exactly, so
two integers that one float would stand for are told apart. What a sink leaves out or redacts by
design is not a difference.

End to end: the hostile API server (it serves bytes exactly as scripted, numbers beyond 64 bits
included, which the simulator cannot) holds a Pod with big integers; the bridge (in-process) writes
it to a file sink; ``verify`` (a process) finds that file equal to the cluster, and a copy of it
whose big integer differs in its last digit altered."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from bridge.service.config import BridgeConfig
from bridge.service.service import BridgeService
from bridge.service.verify import ClusterObject, ResourceScope, verify
from bridge.service.verify_sources import read_file
from tests.hostile.apiserver import HostileApiServer, obj
from tests.service.test_service import eventually

pytestmark = pytest.mark.usefixtures("own_cwd")

ROOT = Path(__file__).resolve().parents[2]
PODS = ResourceScope(name="pods", api_version="v1", kind="Pod")
BIG = b'{"wide":18446744073709551617,"wider":123456789012345678901234567890,"safe":9007199254740993}'
"""Beyond 64 bits (orjson: a float), far beyond, and beyond 2^53 (a float64 would round it)."""


def line(raw_object: bytes, *, rv: str = "2", uid: str = "uid-big") -> bytes:
    """A structured CloudEvent whose ``data`` is ``raw_object`` spliced in as the bridge does."""
    head = {"specversion": "1.0", "id": f"{uid}-{rv}", "source": "/clusters/test/api/v1/pods",
            "type": "io.kube-event-bridge.added", "subject": "default/big",
            "datacontenttype": "application/json",
            "cluster": "test", "kind": "Pod", "apiversion": "v1", "namespace": "default", "name": "big",
            "uid": uid, "resourceversion": rv}
    return orjson.dumps(head)[:-1] + b',"data":' + raw_object + b"}\n"


def cluster_object(raw: bytes) -> ClusterObject:
    decoded: dict[str, Any] = msgspec.json.decode(raw)
    meta = decoded["metadata"]
    return ClusterObject(uid=meta["uid"], key=f"{meta['namespace']}/{meta['name']}",
                         resource_version=meta["resourceVersion"], obj=decoded)


def check(tmp_path: Path, sink_lines: bytes, cluster_raw: bytes) -> dict[str, Any]:
    path = tmp_path / "events.jsonl"
    path.write_bytes(sink_lines)
    contents = read_file(path)
    assert contents.undecodable == []
    report = verify(sink="t", events=contents.events, cluster={PODS: [cluster_object(cluster_raw)]})
    (r,) = report.to_json()["resources"]
    assert report.ok is (r["altered"] == r["stale"] == 0)
    resource: dict[str, Any] = r
    return resource


@pytest.mark.parametrize(("sink_body", "path"), [
    (BIG.replace(b"551617", b"551616"), "spec.wide"),
    (BIG.replace(b"567890,", b"567891,"), "spec.wider"),
    (BIG.replace(b"740993", b"740992"), "spec.safe"),
    (BIG.replace(b"9007199254740993", b"9007199254740993.0"), "spec.safe"),  # a float now: rounded
])
def test_a_big_integer_differing_in_its_last_digit_is_reported(
        tmp_path: Path, sink_body: bytes, path: str) -> None:
    cluster = obj("Pod", "big", 2, body=BIG)
    r = check(tmp_path, line(obj("Pod", "big", 2, body=sink_body)), cluster)
    assert (r["consistent"], r["stale"], r["altered"]) == (False, 0, 1)
    assert r["examples"]["altered"] == [{"object": "default/big", "uid": "uid-big", "resourceversion": "2",
                                         "path": path, "difference": "value"}]


def test_an_exact_sink_passes(tmp_path: Path) -> None:
    r = check(tmp_path, line(obj("Pod", "big", 2, body=BIG)), obj("Pod", "big", 2, body=BIG))
    assert (r["consistent"], r["altered"]) == (True, 0)


@pytest.mark.parametrize(("sink_body", "cluster_body", "found"), [
    # What a sink leaves out by design (fields, redact.drop, an oversized object's truncation).
    (b'{"a":1}', b'{"a":1,"b":{"c":2}}', None),
    # Redacted values stand for any value.
    (b'{"a":"<redacted>","b":{"c":"<redacted>"}}', b'{"a":1,"b":{"c":[2,3]}}', None),
    (b'{"a":1.0}', b'{"a":1}', None),  # one JSON number
    (b'{"a":true}', b'{"a":1}', ("spec.a", "value")),
    (b'{"a":null}', b'{"a":0}', ("spec.a", "value")),
    (b'{"a":[1,2]}', b'{"a":[1,2,3]}', ("spec.a", "list length")),
    (b'{"a":[{"b":"x"}]}', b'{"a":[{"b":"y"}]}', ("spec.a[0].b", "value")),
    (b'{"a":1,"odd.key":2}', b'{"a":1}', ('spec["odd.key"]', "not in the cluster's object")),
])
def test_what_counts_as_a_difference(tmp_path: Path, sink_body: bytes, cluster_body: bytes,
                                     found: tuple[str, str] | None) -> None:
    r = check(tmp_path, line(obj("Pod", "big", 2, body=sink_body)), obj("Pod", "big", 2, body=cluster_body))
    if found is None:
        assert r["altered"] == 0
    else:
        assert [(e["path"], e["difference"]) for e in r["examples"]["altered"]] == [found]


def test_a_stale_object_is_not_also_altered_and_a_listed_object_without_content_is_not_compared(
        tmp_path: Path) -> None:
    sink = line(obj("Pod", "big", 2, body=b'{"a":1}'))
    r = check(tmp_path, sink, obj("Pod", "big", 3, body=b'{"a":2}'))
    assert (r["stale"], r["altered"]) == (1, 0)
    path = tmp_path / "events.jsonl"
    report = verify(sink="t", events=read_file(path).events,
                    cluster={PODS: [ClusterObject(uid="uid-big", key="default/big", resource_version="2")]})
    assert report.ok


# --------------------------------------------------------------------------------------------------
# end to end


@pytest.fixture
async def server() -> AsyncIterator[HostileApiServer]:
    srv = HostileApiServer()
    await srv.start()
    yield srv
    await srv.stop()


async def run_verify(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.service.cli", "verify", *args, "--json", cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode in (0, 1), err.decode()
    return proc.returncode, orjson.loads(out), err.decode()


async def test_verify_finds_the_bridge_output_exact_and_a_sink_that_changed_a_last_digit_altered(
        server: HostileApiServer, tmp_path: Path) -> None:
    server.resources["pods"].items = [obj("Pod", "big", 2, body=BIG), obj("Pod", "small", 1)]
    server.resources["pods"].list_rv = 2
    kubeconfig = server.write_kubeconfig(tmp_path / "kc")
    out = tmp_path / "out.jsonl"
    service = BridgeService(config=BridgeConfig.model_validate({
        "cluster": "test",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "pods", "namespace": "default"}],
        "sinks": [{"name": "file", "kind": "file", "path": str(out)}],
        "checkpoint": {"store": "none", "spill_directory": str(tmp_path / "spill")},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "shutdown_deadline": 5,
    }))
    task = asyncio.create_task(service.run(), name="service-under-test")
    try:
        await eventually(lambda: out.exists() and out.read_bytes().count(b"io.kube-event-bridge.added") == 2,
                         what="both objects in the file")
    finally:
        service.stop_event.set()
        assert await task == 0
    written = out.read_bytes()
    assert b"18446744073709551617" in written  # exact on the bridge's path
    common = ["--kubeconfig", str(kubeconfig), "--resource", "pods@default", "--cluster", "test"]

    code, report, _ = await run_verify(*common, "--file", str(out))
    (r,) = report["resources"]
    assert (code, r["consistent"], r["altered"]) == (0, True, 0)
    assert (r["cluster_objects"], r["sink_objects"]) == (2, 2)

    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(written.replace(b"18446744073709551617", b"18446744073709551618"))
    code, report, _ = await run_verify(*common, "--file", str(corrupt))
    (r,) = report["resources"]
    assert (code, r["consistent"], r["stale"], r["altered"]) == (1, False, 0, 1)
    assert r["examples"]["altered"] == [{"object": "default/big", "uid": "uid-big", "resourceversion": "2",
                                         "path": "spec.wide", "difference": "value"}]
