"""The decoders' bounds (bridge/jsonbounds.py, bridge/kube/bounded.py): the depth measure is exact
(against a recursive reference), the bounded decoders decode exactly what the plain ones do for every
input within the bounds (a Hypothesis differential test: the check must never change a result, only
catch what is beyond), and whatever is beyond is quarantined with the identity a shallow scan reads,
or raises the project's DecodeError, never anything else."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.errors import DecodeError
from bridge.jsonbounds import MAX_DEPTH, depth, elements, exceeds_depth, members
from bridge.kube import bounded
from bridge.kube.listwatch import decode_list, decode_watch_event, raw_object_decoder, split_list
from bridge.rawobject import RawObject
from tests.hostile.apiserver import deep_value, event_line, obj

_bounded = raw_object_decoder(drop_managed_fields=True)
_plain = raw_object_decoder(drop_managed_fields=True, bounded=False)


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('{}[]"\\ab,:é\n')),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet=st.sampled_from('{}[]"\\k:,'), max_size=4), children, max_size=4),
    max_leaves=40,
)


@given(json_values, st.sampled_from([None, 2, 0]))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_the_depth_measure_is_exact_whatever_the_strings_hold(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent).encode()
    assert depth(text) == reference_depth(value)
    for limit in (0, 1, 3):
        assert exceeds_depth(text, limit) == (reference_depth(value) > limit)


def pod(spec: Any, name: str = "p") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "7",
                         "managedFields": [{"manager": "m", "operation": "Update",
                                            "time": "2024-01-01T00:00:00Z"}]},
            "spec": spec}


@given(json_values, st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_within_the_bounds_the_bounded_decoders_decode_what_the_plain_ones_do(spec: Any, type_: str) -> None:
    line = msgspec.json.encode({"type": type_, "object": pod(spec)})  # big integers too
    got, want = _bounded(line), _plain(line)
    assert got.type is want.type
    assert type(got.object) is RawObject
    assert type(want.object) is RawObject
    assert got.object.raw == want.object.raw
    assert got.object.malformed == ""
    assert decode_watch_event(line).object == msgspec.json.decode(line)["object"]
    body = (b'{"kind":"PodList","metadata":{"resourceVersion":"9"},"items":['
            + msgspec.json.encode(pod(spec)) + b"]}")
    (item,) = decode_list(body, api_version="v1", kind="Pod", raw_objects=True).items
    assert type(item) is RawObject
    assert item.malformed == ""


@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH])
def test_at_the_bound_an_object_is_decoded_whole(levels: int) -> None:
    raw = obj("Pod", "edge", 3, body=deep_value(levels - 1))
    assert depth(raw) == levels
    event = _bounded(event_line("ADDED", raw).rstrip())
    assert type(event.object) is RawObject
    assert event.object.malformed == ""
    assert event.object.raw == raw


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 254, 300, 999, 5000, 100_000])
def test_beyond_the_bound_an_object_is_quarantined_by_every_decoder(levels: int) -> None:
    raw = obj("Pod", "deep", 3, body=deep_value(levels - 1))
    line = event_line("MODIFIED", raw).rstrip()
    ident = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "deep", "namespace": "default", "uid": "uid-deep", "resourceVersion": "3"}}
    for decode in (_bounded, decode_watch_event, raw_object_decoder()):
        event = decode(line)
        assert event.type.value == "MODIFIED"
        assert type(event.object) is RawObject
        assert event.object.malformed == "depth"
        assert event.object.quarantined == raw
        assert dict(event.object) == ident
        assert event.object.fresh().quarantined == b""  # what a cache keeps: the identity alone
        assert event.object.fresh().malformed == "depth"
    body = b'{"kind":"PodList","metadata":{"resourceVersion":"9","continue":"c"},"items":[' \
        + obj("Pod", "ok", 1) + b"," + raw + b"]}"
    meta, items = split_list(body)
    assert (meta.resourceVersion, meta.continue_) == ("9", "c")
    assert len(items) == 2
    page = decode_list(body, api_version="v1", kind="Pod", raw_objects=True)
    assert [o.malformed for o in page.items] == ["", "depth"]  # type: ignore[attr-defined]
    assert dict(page.items[1]) == ident
    assert page.continue_token == "c"


def test_an_object_over_the_size_bound_is_quarantined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "MAX_OBJECT_BYTES", 1000)
    raw = obj("Pod", "big", 3, body=orjson.dumps("x" * 2000))
    got = bounded.quarantined_item(raw)
    assert got is not None
    assert got.malformed == "size"
    assert got.key == "default/big"


@pytest.mark.parametrize("line", [
    b'{"type":"ERROR","object":' + deep_value(400) + b"}",
    b'{"object":' + obj("Pod", "x", 1, body=deep_value(400)) + b"}",
    b'{"type":"ADDED","object":[' + deep_value(400) + b"]}",
    b"[" * 5000,
    b'{"type":"ADDED","object":{"metadata":' + b"{" * 3000,
])
def test_a_line_beyond_the_bounds_that_is_no_object_event_raises_the_decode_error(line: bytes) -> None:
    for decode in (_bounded, decode_watch_event):
        with pytest.raises(DecodeError):
            decode(line)


def test_the_identity_scan_reads_only_the_first_bytes_and_survives_garbage() -> None:
    deep_metadata = b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"n","labels":' + deep_value(500) \
        + b',"uid":"u","resourceVersion":"5"},"spec":{}}'
    got = bounded.quarantined_item(deep_metadata)
    assert got is not None
    assert (got.name, got.uid, got.resource_version) == ("n", "u", "5")
    late = b'{"spec":' + deep_value(400) + b',"pad":"' + b"x" * 70_000 + b'","metadata":{"name":"late"}}'
    got = bounded.quarantined_item(late)
    assert got is not None
    assert got.name == ""  # beyond the scan: not read (the reflector skips an object without a name)
    assert list(members(b'{"a": 1 , "b" : [1, {"c": "}"}] }')) == [(b"a", 6, 7), (b"b", 16, 31)]
    assert list(elements(b"[ 1 , [2] ]")) == [(2, 3), (6, 9)]
