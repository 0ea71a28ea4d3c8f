"""Integers beyond 64 bits in an object (a CRD's spec may hold any JSON number) reach every sink's
bytes exactly as the API server sent them: on the raw path (the object's bytes spliced in), on a
redaction path (the object decoded, changed and encoded again) and on the merge-patch path (two
states decoded, their difference encoded). orjson would round them to floats when decoding and
refuse them when encoding; nothing may round them silently, and nothing is dropped for them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tests.service.in_process import running_service
from tests.service.test_service import eventually

from .apiserver import HostileApiServer, event_line, obj
from .bridge_config import bridge_config, file_sink

BIG = b"123456789012345678901234567890"
NEGATIVE = b"-98765432109876543210987654321"
LATER = b"18446744073709551616"  # 2**64


def events(path: Path, name: str) -> list[bytes]:
    if not path.exists():
        return []
    return [line for line in path.read_bytes().splitlines()
            if msgspec.json.decode(line).get("name") == name]


async def test_integers_beyond_64_bits_reach_the_raw_redacting_and_merge_patch_sinks_exactly(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING")
    pods = server.resources["pods"]
    pods.items = [obj("Pod", "big", 1, body=b'{"a":"hidden","n":' + BIG + b',"m":[' + NEGATIVE + b"]}")]
    pods.watch_lines = [event_line("MODIFIED", obj("Pod", "big", 2,
                                                   body=b'{"a":"hidden","n":' + LATER + b',"m":[1]}'))]
    server.resources["configmaps"].items = [obj("ConfigMap", "cm-0", 1)]
    sinks = {name: tmp_path / f"{name}.jsonl" for name in ("plain", "redacting", "patching")}
    config = bridge_config(server, tmp_path, resources=["pods", "configmaps"], sinks=[
        file_sink("plain", sinks["plain"], dead_letter=tmp_path / "plain-dl.jsonl"),
        file_sink("redacting", sinks["redacting"], dead_letter=tmp_path / "redacting-dl.jsonl",
                  redact={"paths": ["spec.a"]}),
        file_sink("patching", sinks["patching"], dead_letter=tmp_path / "patching-dl.jsonl",
                  payload="merge_patch")])
    async with running_service(config):
        await eventually(lambda: all(len(events(path, "big")) == 2 for path in sinks.values()),
                         what="both changes of the object in every sink")
    for name, path in sinks.items():
        added, modified = events(path, "big")
        assert b'"n":' + BIG in added, (name, added)
        assert NEGATIVE in added, (name, added)
        assert b'"n":' + LATER in modified, (name, modified)
        assert b"e+" not in added + modified, (name, added, modified)  # no float in either
    added, modified = events(sinks["redacting"], "big")
    assert b"hidden" not in added + modified
    assert b'"m":[1]' in events(sinks["patching"], "big")[1]  # the patch: the list replaced whole
    dead = {name: (tmp_path / f"{name}-dl.jsonl").read_bytes()[:600] for name in sinks
            if (tmp_path / f"{name}-dl.jsonl").exists()}
    assert not any(dead.values()), dead  # nothing dead-lettered (the files are created empty)
    assert not [r for r in caplog.records if "cannot encode" in r.getMessage()]
