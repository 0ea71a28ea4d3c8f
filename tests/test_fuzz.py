"""A short fuzzing run in CI of what reads bytes from the network or from users (the long,
coverage-guided runs are ``python -m bench.fuzz``; the properties are in ``bench/fuzz_targets.py``):
watch lines (every decoder, RawObject identity and the managedFields cut against a full JSON
decode), List answers, checkpoints (under a valid checksum too) and configuration files."""

from __future__ import annotations

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz_targets import SEEDS, TARGETS
from bridge.kube.listwatch import WatchDecodeError, decode_list, decode_watch_event
from bridge.rawobject import RawObject, decode_object

_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8))
_json = st.recursive(_json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
_meta_keys = st.sampled_from(["name", "namespace", "uid", "resourceVersion", "managedFields", "labels", "x"])
_metadata = st.dictionaries(_meta_keys, _json, max_size=5)
_objects = st.fixed_dictionaries({"metadata": _metadata}, optional={
    "apiVersion": st.just("v1"), "kind": st.just("Pod"), "spec": _json})
_types = st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "NOPE"])


def _mutated(seed: bytes, cut: int, insert: bytes) -> bytes:
    at = cut % (len(seed) + 1)
    return seed[:at] + insert + seed[at + 1:]


def _inputs(target: str) -> st.SearchStrategy[bytes]:
    seeds = st.sampled_from(SEEDS[target])
    return st.one_of(st.binary(max_size=512), seeds,
                     st.builds(_mutated, seeds, st.integers(0, 4096), st.binary(max_size=8)))


_FAST = settings(max_examples=300, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(st.one_of(_inputs("watch-line"),
                 st.builds(lambda t, o: orjson.dumps({"type": t, "object": o}), _types, _objects),
                 st.builds(lambda t, o: orjson.dumps({"object": o, "type": t}), _types, _objects)))
def test_fuzz_watch_line(data: bytes) -> None:
    TARGETS["watch-line"](data)


@_FAST
@given(st.one_of(_inputs("list"), st.builds(
    lambda items, rv: orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": rv}, "items": items}),
    st.lists(_objects, max_size=3), st.text(max_size=4))))
def test_fuzz_list(data: bytes) -> None:
    TARGETS["list"](data)


@_FAST
@given(_inputs("checkpoint"))
def test_fuzz_checkpoint(data: bytes) -> None:
    TARGETS["checkpoint"](data)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs("config"))
def test_fuzz_config(data: bytes) -> None:
    TARGETS["config"](data)


@pytest.mark.parametrize("body", [
    b'{"kind":"PodList","metadata":{},"items":[{"metadata":{"name":"a"},"\xff":1}]}',
    b'{"kind":"PodList","metadata":{},"items":[{"metadata":{"na\x8dme":"a"}}]}',
])
def test_invalid_utf8_in_a_list_item_quarantines_that_item_alone(body: bytes) -> None:
    """Found by fuzzing: msgspec reports invalid UTF-8 in a key as UnicodeDecodeError, which used to
    escape the list decoder. Such an item is now quarantined (``encoding``) and the List taken: one
    item must not fail the List (its resource would never sync)."""
    good = b'{"metadata":{"name":"b","resourceVersion":"3"}}'
    body = body.replace(b"]}", b"," + good + b"]}")
    for raw_objects in (False, True):
        page = decode_list(body, raw_objects=raw_objects)
        bad, kept = page.items
        assert type(bad) is RawObject
        assert bad.malformed == "encoding"
        assert kept["metadata"]["name"] == "b"


def test_invalid_utf8_in_a_watch_line_or_an_object_is_a_decode_error() -> None:
    with pytest.raises(WatchDecodeError):
        decode_watch_event(b'{"type":"ADDED","object":{"metadata":{"name":"a"},"\xff":1}}')
    with pytest.raises(ValueError, match="not a Kubernetes object"):
        decode_object(b'{"metadata":{"name":"a","\xff":1}}')


def test_invalid_utf8_anywhere_in_a_watch_line_is_a_decode_error_for_every_decoder() -> None:
    """Found by fuzzing: bytes msgspec skips (an unknown member) were not checked, so a line that
    is not JSON was accepted by the dict decoders."""
    from bridge.kube.listwatch import WATCH_EVENT_DECODERS

    line = b'{"type":"ADDED","object":{"metadata":{"name":"a"}},"x":"\xff"}'
    for decode in WATCH_EVENT_DECODERS.values():
        with pytest.raises(WatchDecodeError):
            decode(line)


def test_an_object_re_encoded_keeps_its_numbers_and_its_identity() -> None:
    """Found by fuzzing: an object laid out unlike the API server's compact JSON (here a duplicate
    name) is decoded and re-encoded; orjson turned an integer beyond 64 bits into a float there, so
    the RawObject's bytes no longer decoded to the object the server sent."""
    from bridge.kube.listwatch import raw_object_decoder

    big = 6666666666666666666666666666666666666666
    line = (b'{"type":"ADDED","object":{"metadata":{"name": {},"managedFields":[%d],"name":"b"},'
            b'"spec":{"n":%d}}}' % (big, big))
    for cut in (False, True):
        obj = raw_object_decoder(drop_managed_fields=cut)(line).object
        assert isinstance(obj, RawObject)
        assert obj.identity[:2] == ("b", "")
        sent = msgspec.json.decode(obj.raw)  # the bytes forwarded to sinks
        assert sent["spec"]["n"] == big
        assert ("managedFields" in sent["metadata"]) is not cut
    TARGETS["watch-line"](line)
