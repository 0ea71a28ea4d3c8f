"""The one-pass decode of a watch line (bridge/watchline.py) against today's path, the plain one:
what it takes (a line as API servers write it, with and without managedFields, cut or kept) it
decodes into the same RawObject, slot for slot, and what it declines falls back to that path (a
seeded differential test over generated lines: layouts, managedFields, hostile keys, damage)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import orjson
import pytest

from bridge.kube.listwatch import raw_object_decoder
from bridge.rawobject import RawObject, RawObjectError
from bridge.watchline import decode_watch_line

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

_WORDS = ["a", "web", "kube-system", "é", "日本", "🙂", "\u2028", 'q"uote', "back\\slash", "new\nline", "",
          "managedFields", '"managedFields":', "metadata", '"metadata":{', "}", "]", "\\u0065", "<&>"]
_KEYS = ["x", "spec", "status", "data", "managedFields", "metadata", "name", "items", "é", "k\\"]
_ENTRY_KEYS = ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource")
_TYPES = ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "NOPE"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice([None, True, False, 0, -7, 2**64 + 3, -(2**70), 1.5, rng.choice(_WORDS),
                           6666666666666666666666666666666666666666])
    if roll < 0.7:
        return {rng.choice(_KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def _entry(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return rng.choice([1, "x", None, [], {"manager": 5}])
    entry: dict[str, Any] = {"manager": rng.choice(["kubelet", "kubectl", "m", "é"]),
                             "operation": rng.choice(["Update", "Apply"]), "apiVersion": "v1",
                             "time": f"2024-05-0{rng.randrange(1, 4)}T12:00:0{rng.randrange(3)}Z",
                             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:x": {}}}}
    if rng.random() < 0.3:
        entry["subresource"] = "status"
    if rng.random() < 0.1:
        entry.pop(rng.choice(_ENTRY_KEYS), None)
    keys = list(entry)
    if rng.random() < 0.3:
        rng.shuffle(keys)
    return {k: entry[k] for k in keys}


def _metadata(rng: random.Random) -> Any:
    if rng.random() < 0.03:
        return rng.choice([None, "m", [], 3])
    meta: dict[str, Any] = {}
    for key in ("name", "generateName", "namespace", "uid", "resourceVersion", "labels", "annotations"):
        if rng.random() < 0.8:
            meta[key] = rng.choice(_WORDS) if key not in ("labels", "annotations") else {
                rng.choice(_WORDS): rng.choice(_WORDS) for _ in range(rng.randrange(3))}
    if rng.random() < 0.03:
        meta[rng.choice(["name", "namespace", "uid", "resourceVersion"])] = rng.choice([None, 5, [], {}])
    roll = rng.random()
    if roll < 0.6:
        meta["managedFields"] = [_entry(rng) for _ in range(rng.randrange(1, 4))]
    elif roll < 0.7:
        meta["managedFields"] = rng.choice([[], None, "x", 7, {"a": 1}])
    if rng.random() < 0.1:  # API servers write managedFields last, the simulator before uid & co.
        meta["uid"] = meta.pop("uid", "u")
    if rng.random() < 0.05:
        meta["labels"] = {"managedFields": meta.get("managedFields", [])}
    keys = list(meta)
    if rng.random() < 0.2:
        rng.shuffle(keys)
    return {k: meta[k] for k in keys}


def _object(rng: random.Random) -> Any:
    obj: dict[str, Any] = {}
    if rng.random() < 0.9:
        obj["apiVersion"] = "v1" if rng.random() < 0.97 else 5
    if rng.random() < 0.9:
        obj["kind"] = "Pod"
    if rng.random() < 0.97:
        obj["metadata"] = _metadata(rng)
    for key in ("spec", "status"):
        if rng.random() < 0.7:
            obj[key] = _value(rng)
    if rng.random() < 0.05 and isinstance(obj.get("metadata"), dict):
        obj["spec"] = {"template": {"metadata": obj["metadata"]}}  # the same bytes nested
    keys = list(obj)
    if rng.random() < 0.2:
        rng.shuffle(keys)
    return {k: obj[k] for k in keys}


def _encode(rng: random.Random, value: Any) -> bytes:
    roll = rng.random()
    if roll < 0.8:
        return msgspec.json.encode(value)  # compact, keys in order, integers exact
    if roll < 0.9:
        return json.dumps(value, ensure_ascii=True).encode()  # ", " and ": ", \\u escapes
    return json.dumps(value, indent=rng.choice([None, 1]), separators=(",", ":"), ensure_ascii=False).encode()


def _escape_a_key(rng: random.Random, text: bytes) -> bytes:
    """One key's letter written as a \\u escape: the same JSON, another layout."""
    for key in (b'"managedFields"', b'"metadata"', b'"object"', b'"name"'):
        at = text.find(key)
        if at >= 0 and rng.random() < 0.5:
            return text[:at + 2] + b"\\u%04x" % text[at + 2] + text[at + 3:]
    return text


def _duplicate_member(rng: random.Random, body: bytes, obj: Any) -> bytes:
    """A top-level metadata, or a metadata's managedFields, written twice (JSON readers here take
    the last): the same value or another one."""
    meta = obj.get("metadata")
    if rng.random() < 0.5 or not isinstance(meta, dict):
        other = meta if rng.random() < 0.5 else _metadata(rng)
        return body[:-1] + b',"metadata":' + msgspec.json.encode(other) + b"}"
    mf = meta.get("managedFields", [])
    again = mf if rng.random() < 0.5 else [_entry(rng)]
    key = b'"metadata":{'
    at = body.find(key)
    if at < 0:
        return body
    at += len(key)
    return body[:at] + b'"managedFields":' + msgspec.json.encode(again) + b"," + body[at:]


def _line(rng: random.Random) -> bytes:
    type_ = rng.choice(_TYPES) if rng.random() < 0.2 else rng.choice(_TYPES[:3])
    if type_ == "ERROR":
        body = _encode(rng, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                             "code": 410, "reason": "Expired"})
    elif type_ == "BOOKMARK":
        body = _encode(rng, {"kind": "Pod", "apiVersion": "v1", "metadata": {
            "resourceVersion": str(rng.randrange(10**6)),
            "annotations": {"k8s.io/initial-events-end": "true"}}})
    else:
        obj = _object(rng)
        body = _encode(rng, obj)
        if rng.random() < 0.05 and body.endswith(b"}") and len(body) > 2:
            body = _duplicate_member(rng, body, obj)
    if rng.random() < 0.05:
        body = _escape_a_key(rng, body)
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
        line = _escape_a_key(rng, head + b',"object":' + body + b"}")
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
