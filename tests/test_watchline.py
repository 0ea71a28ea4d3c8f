"""The one-pass decode of a watch line (bridge/watchline.py) against today's path, the plain one:
what it takes (a line as API servers write it, with and without managedFields, cut or kept) it
decodes into the same RawObject, slot for slot, and what it declines falls back to that path (a
seeded differential test over generated lines: layouts, managedFields, hostile keys, damage)."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import orjson
import pytest

from bridge.kube.listwatch import raw_object_decoder
from bridge.rawobject import RawObject, RawObjectError
from bridge.watchline import decode_watch_line
from tests.objgen import duplicate_member, encode, escape_a_key, k8s_object

MF = [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2024-05-01T12:00:00Z",
       "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}}]


def slots(obj: object) -> dict[str, object]:
    """Every slot of a RawObject, but for the decoded views (``_meta``, ``_obj``: caches, which one
    path fills as it decodes and the other on first read), and the metadata they decode to."""
    assert type(obj) is RawObject
    got: dict[str, object] = {name: getattr(obj, name) for name in RawObject.__slots__
                              if name not in ("_meta", "_obj")}
    try:
        got["metadata"] = obj.fresh().metadata
    except RawObjectError as e:
        got["metadata"] = str(e)
    return got


def pod(name: str = "a", mf: bool = True) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "7"}
    if mf:
        meta["managedFields"] = MF
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "n1"}}


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("mf", [False, True])
def test_a_line_as_api_servers_write_it_takes_one_pass_as_the_plain_path_decodes_it(drop: bool,
                                                                                     mf: bool) -> None:
    line = orjson.dumps({"type": "MODIFIED", "object": pod(mf=mf)})
    fast = decode_watch_line(line, drop)
    assert fast is not None
    kind, obj = fast
    want = raw_object_decoder(drop_managed_fields=drop, one_pass=False)(line)
    assert kind is want.type
    assert slots(obj) == slots(want.object)
    assert ("managedFields" in orjson.loads(obj.raw)["metadata"]) is (mf and not drop)
    assert obj.managed_fields is (mf and not drop)


_V = b'[{"manager":"m","time":"2024-01-01T00:00:00Z"}]'


@pytest.mark.parametrize("obj", [
    b'{"spec":{"managedFields":' + _V + b'},"metadata":{"name":"a","managedFi\\u0065lds":' + _V + b'}}',
    b'{"metadata":{"name":"a","managedFi\\u0065lds":' + _V + b'},"spec":{"managedFields":' + _V + b'}}',
    b'{"metadata":{"name":"x","managedFields":' + _V + b'},'
    b'"metadata":{"name":"a","managedFields":' + _V + b'}}',
    b'{"metadata":{"name":"a","labels":{"managedFields":"v"},"managedFields":' + _V + b'}}',
    b'{"metadata":{"name":"a","managedFields":' + _V + b',"uid":"managedFields"}}',
])
def test_managed_fields_are_cut_from_the_metadata_alone_whatever_else_holds_their_name(obj: bytes) -> None:
    """The same value under a key of that name elsewhere, the metadata's key escaped, the metadata
    written twice: the cut takes the metadata's own member (as the last ``metadata`` reads) or the
    object is decoded and written again, never another member cut."""
    line = b'{"type":"ADDED","object":' + obj + b"}"
    got = raw_object_decoder(drop_managed_fields=True)(line).object
    assert type(got) is RawObject
    want = msgspec.json.decode(obj)
    want["metadata"].pop("managedFields")
    assert msgspec.json.decode(got.raw) == want
    assert (got.name, got.managed_fields) == ("a", False)
    assert got.change is not None


# ---------------------------------------------------------------------- the differential test

_TYPES = ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "NOPE"]


def _line(rng: random.Random) -> bytes:
    type_ = rng.choice(_TYPES) if rng.random() < 0.2 else rng.choice(_TYPES[:3])
    if type_ == "ERROR":
        body = encode(rng, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                             "code": 410, "reason": "Expired"})
    elif type_ == "BOOKMARK":
        body = encode(rng, {"kind": "Pod", "apiVersion": "v1", "metadata": {
            "resourceVersion": str(rng.randrange(10**6)),
            "annotations": {"k8s.io/initial-events-end": "true"}}})
    else:
        obj = k8s_object(rng)
        body = encode(rng, obj)
        if rng.random() < 0.05 and body.endswith(b"}") and len(body) > 2:
            body = duplicate_member(rng, body, obj)
    if rng.random() < 0.05:
        body = escape_a_key(rng, body)
    head = b'{"type":' + orjson.dumps(type_)
    roll = rng.random()
    if roll < 0.8:
        line = head + b',"object":' + body + b"}"
    elif roll < 0.85:
        line = b'{"object":' + body + b',"type":' + orjson.dumps(type_) + b"}"
    elif roll < 0.9:
        line = head + b', "object": ' + body + b" }"
    elif roll < 0.95:
        line = head + b',"object":' + body + rng.choice([b',"type":"ADDED"', b',"object":{"metadata":{}}',
                                                         b',"x":1', b""]) + b"}"
    else:
        line = escape_a_key(rng, head + b',"object":' + body + b"}")
    roll = rng.random()
    if roll < 0.05:
        line += rng.choice([b"\n", b" ", b"\r\n"])
    elif roll < 0.1:  # damaged: cut short or a byte changed (invalid UTF-8 too)
        at = rng.randrange(len(line))
        line = line[:at] if rng.random() < 0.5 else line[:at] + bytes([rng.randrange(256)]) + line[at + 1:]
    return line


def _outcome(decode: Any, line: bytes) -> Any:
    try:
        event = decode(line)
    except Exception as e:  # the same error, with the same message, is the contract here
        return ("raises", type(e), str(e))
    obj = event.object
    return (event.type, slots(obj) if type(obj) is RawObject else obj)


_LINES = 4000
_SEEDS = (1, 2, 3)


@pytest.mark.parametrize("seed", _SEEDS)
def test_the_one_pass_decodes_every_generated_line_as_the_plain_path(seed: int) -> None:
    """Seeded: thousands of lines per run, each decoded by both paths, cut and kept. The one pass
    must be taken for most of them (the generator writes most lines as API servers do)."""
    rng = random.Random(seed)
    decoders = {drop: (raw_object_decoder(drop_managed_fields=drop),
                       raw_object_decoder(drop_managed_fields=drop, one_pass=False))
                for drop in (False, True)}
    taken = 0
    for i in range(_LINES):
        line = _line(rng)
        for drop, (fast, plain_) in decoders.items():
            assert _outcome(fast, line) == _outcome(plain_, line), \
                f"seed {seed}, line {i}, drop={drop}: {line!r}"
            if decode_watch_line(line, drop) is not None:
                taken += 1
    assert taken > _LINES  # of 2 x _LINES decodes, the one pass took more than half
