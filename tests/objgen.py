"""Generated Kubernetes objects for the decoders' differential tests (tests/test_watchline.py,
tests/api/test_list_one_pass.py): seeded, mostly as API servers write them (compact JSON, managedFields
from several writers), with the layouts, hostile strings and damage the one-pass decodes must
decline or decode exactly as the plain path does (other encoders' whitespace and escapes, escaped
keys, duplicate members, integers beyond 64 bits, non-string identity, the metadata's bytes nested
again)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec

__all__ = ["duplicate_member", "encode", "entry", "escape_a_key", "k8s_object", "metadata", "value"]

WORDS = ["a", "web", "kube-system", "é", "日本", "🙂", "\u2028", 'q"uote', "back\\slash", "new\nline", "",
          "managedFields", '"managedFields":', "metadata", '"metadata":{', "}", "]", "\\u0065", "<&>"]
KEYS = ["x", "spec", "status", "data", "managedFields", "metadata", "name", "items", "é", "k\\"]
ENTRY_KEYS = ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource")


def value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value up to four levels deep: scalars (integers beyond 64 bits, hostile strings),
    objects with keys the decoders look for, arrays."""
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice([None, True, False, 0, -7, 2**64 + 3, -(2**70), 1.5, rng.choice(WORDS),
                           6666666666666666666666666666666666666666])
    if roll < 0.7:
        return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [value(rng, depth + 1) for _ in range(rng.randrange(4))]


def entry(rng: random.Random) -> Any:
    """A managedFields entry (now and then not one, or missing a member, its members shuffled)."""
    if rng.random() < 0.05:
        return rng.choice([1, "x", None, [], {"manager": 5}])
    fields: dict[str, Any] = {"manager": rng.choice(["kubelet", "kubectl", "m", "é"]),
                             "operation": rng.choice(["Update", "Apply"]), "apiVersion": "v1",
                             "time": f"2024-05-0{rng.randrange(1, 4)}T12:00:0{rng.randrange(3)}Z",
                             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:x": {}}}}
    if rng.random() < 0.3:
        fields["subresource"] = "status"
    if rng.random() < 0.1:
        fields.pop(rng.choice(ENTRY_KEYS), None)
    keys = list(fields)
    if rng.random() < 0.3:
        rng.shuffle(keys)
    return {k: fields[k] for k in keys}


def metadata(rng: random.Random) -> Any:
    """An object's metadata (now and then not a mapping, or with a non-string identity), managedFields
    last or not, a label holding their name."""
    if rng.random() < 0.03:
        return rng.choice([None, "m", [], 3])
    meta: dict[str, Any] = {}
    for key in ("name", "generateName", "namespace", "uid", "resourceVersion", "labels", "annotations"):
        if rng.random() < 0.8:
            meta[key] = rng.choice(WORDS) if key not in ("labels", "annotations") else {
                rng.choice(WORDS): rng.choice(WORDS) for _ in range(rng.randrange(3))}
    if rng.random() < 0.03:
        meta[rng.choice(["name", "namespace", "uid", "resourceVersion"])] = rng.choice([None, 5, [], {}])
    roll = rng.random()
    if roll < 0.6:
        meta["managedFields"] = [entry(rng) for _ in range(rng.randrange(1, 4))]
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


def k8s_object(rng: random.Random) -> Any:
    """A Kubernetes object (now and then without metadata, or with a non-string apiVersion), members
    shuffled now and then, its metadata nested again in its spec now and then."""
    obj: dict[str, Any] = {}
    if rng.random() < 0.9:
        obj["apiVersion"] = "v1" if rng.random() < 0.97 else 5
    if rng.random() < 0.9:
        obj["kind"] = "Pod"
    if rng.random() < 0.97:
        obj["metadata"] = metadata(rng)
    for key in ("spec", "status"):
        if rng.random() < 0.7:
            obj[key] = value(rng)
    if rng.random() < 0.05 and isinstance(obj.get("metadata"), dict):
        obj["spec"] = {"template": {"metadata": obj["metadata"]}}  # the same bytes nested
    keys = list(obj)
    if rng.random() < 0.2:
        rng.shuffle(keys)
    return {k: obj[k] for k in keys}


def encode(rng: random.Random, value: Any) -> bytes:
    """``value`` as JSON: mostly compact as API servers write it, else another encoder's layout."""
    roll = rng.random()
    if roll < 0.8:
        return msgspec.json.encode(value)  # compact, keys in order, integers exact
    if roll < 0.9:
        return json.dumps(value, ensure_ascii=True).encode()  # ", " and ": ", \\u escapes
    return json.dumps(value, indent=rng.choice([None, 1]), separators=(",", ":"), ensure_ascii=False).encode()


def escape_a_key(rng: random.Random, text: bytes) -> bytes:
    """One key's letter written as a \\u escape: the same JSON, another layout."""
    for key in (b'"managedFields"', b'"metadata"', b'"object"', b'"name"'):
        at = text.find(key)
        if at >= 0 and rng.random() < 0.5:
            return text[:at + 2] + b"\\u%04x" % text[at + 2] + text[at + 3:]
    return text


def duplicate_member(rng: random.Random, body: bytes, obj: Any) -> bytes:
    """A top-level metadata, or a metadata's managedFields, written twice (JSON readers here take
    the last): the same value or another one."""
    meta = obj.get("metadata")
    if rng.random() < 0.5 or not isinstance(meta, dict):
        other = meta if rng.random() < 0.5 else metadata(rng)
        return body[:-1] + b',"metadata":' + msgspec.json.encode(other) + b"}"
    mf = meta.get("managedFields", [])
    again = mf if rng.random() < 0.5 else [entry(rng)]
    key = b'"metadata":{'
    at = body.find(key)
    if at < 0:
        return body
    at += len(key)
    return body[:at] + b'"managedFields":' + msgspec.json.encode(again) + b"," + body[at:]
