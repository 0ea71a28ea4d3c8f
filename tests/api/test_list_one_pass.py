"""The one-pass decode of List items (bridge/kube/listdecode.py through
bridge/watchline.decode_object_bytes) against today's path, the plain one: every item of a List
becomes the same RawObject, slot for slot, and a cache replaced with either page holds the same
contents; what the one pass declines falls back to that path, and the bounds (size, depth, UTF-8)
quarantine the same items in their place. A seeded differential test over generated List bodies:
items as API servers write them (no apiVersion/kind, managedFields from several writers), other
layouts, escaped and duplicate keys, non-string identity, items that are not objects, huge and deeply
nested ones, bytes that are not UTF-8, Lists too deep to split in one pass."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from bridge.informer.store import IndexedCache
from bridge.jsonbounds import MAX_DEPTH
from bridge.kube import bounded, listdecode
from bridge.kube.listdecode import decode_list, list_page, split_list
from bridge.rawobject import RawObject, decode_object
from bridge.watchline import decode_object_bytes, type_fill
from tests.hostile.apiserver import deep_value
from tests.objgen import duplicate_member, encode, escape_a_key, k8s_object
from tests.test_watchline import slots

_SIZE_BOUND = 8 * 1024
"""The size bound while these tests run (with the real one, 16 MiB, each big item and its
quarantine's scan would be slow)."""

_TYPES = [("v1", "Pod"), ("", ""), ("apps/v1", ""), ("", "Deployment"), ('g\\"/v1', "K\u00e9")]


@pytest.fixture(autouse=True)
def _small_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listdecode, "MAX_OBJECT_BYTES", _SIZE_BOUND)
    monkeypatch.setattr(bounded, "MAX_OBJECT_BYTES", _SIZE_BOUND)


def _grown(rng: random.Random, body: bytes) -> bytes:
    """An object's JSON with a member added at its end: over the size bound, near or over the depth
    bound, or holding a byte that is not UTF-8 (an item on its own, judged in its place)."""
    if not (body.endswith(b"}") and len(body) > 2):
        return body
    roll = rng.random()
    if roll < 0.3:
        member = b'"data":"' + b"x" * rng.choice([_SIZE_BOUND - len(body) - 20, _SIZE_BOUND + 1]) + b'"'
    elif roll < 0.8:
        member = b'"deep":' + deep_value(rng.choice([MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, 300]))
    else:
        member = b'"bad":"\xff\xfe"'
    return body[:-1] + b"," + member + b"}"


def _item(rng: random.Random) -> bytes:
    if rng.random() < 0.02:
        return rng.choice([b"5", b'"x"', b"null", b"[]", b"{}", b'{"metadata":null}', b'{"metadata":[]}'])
    obj = k8s_object(rng)
    for key in ("apiVersion", "kind"):  # List items carry neither on the wire, mostly
        if rng.random() < 0.85:
            obj.pop(key, None)
    body = encode(rng, obj)
    if rng.random() < 0.05 and len(body) > 2:
        body = duplicate_member(rng, body, obj)
    if rng.random() < 0.05:
        body = escape_a_key(rng, body)
    if rng.random() < 0.03:  # the type written escaped: still the member the item has
        body = body.replace(b'"kind"', b'"ki\\u006ed"', 1).replace(b'"apiVersion"', b'"api\\u0056ersion"', 1)
    if rng.random() < 0.04:
        body = _grown(rng, body)
    return body


def _body(rng: random.Random) -> bytes:
    items = [_item(rng) for _ in range(rng.randrange(7))]
    comma = b"," if rng.random() < 0.8 else b" ,\n "
    roll = rng.random()
    if roll < 0.9:
        head = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"c"},'
    else:
        head = b'{ "metadata" : { "resourceVersion" : "9" } , "kind":"PodList", '
    if rng.random() < 0.004:  # too deep for one pass to split: split without recursion
        items.append(b'{"metadata":{"name":"deep"},"spec":' + deep_value(1500) + b"}")
    return head + b'"items":[' + comma.join(items) + b"]}"


def _outcome(body: bytes, *, api_version: str, kind: str, drop: bool, one_pass: bool) -> Any:
    try:
        page = decode_list(body, api_version=api_version, kind=kind, raw_objects=True,
                           drop_managed_fields=drop, one_pass=one_pass)
    except Exception as e:  # the same error, with the same message, is the contract here
        return ("raises", type(e), str(e))
    cache = IndexedCache(compact=True)
    cache.replace([o for o in page.items if o.name], page.resource_version)  # type: ignore[attr-defined]
    stored = {o.key: slots(o) for o in cache.list()}  # type: ignore[attr-defined]
    return ([slots(o) for o in page.items], stored, page.resource_version, page.continue_token)


_BODIES = 1000
_SEEDS = (1, 2, 3)


@pytest.mark.parametrize("seed", _SEEDS)
def test_the_one_pass_decodes_every_generated_list_as_the_plain_path(seed: int) -> None:
    """Seeded: thousands of items per run, each List decoded by both paths, managedFields cut and
    kept, with and without a resource type to write in. The one pass must be taken for most items
    (the generator writes most as API servers do)."""
    rng = random.Random(seed)
    taken = items = 0
    for i in range(_BODIES):
        body = _body(rng)
        api_version, kind = rng.choice(_TYPES)
        fill = type_fill(api_version, kind)
        for drop in (False, True):
            fast = _outcome(body, api_version=api_version, kind=kind, drop=drop, one_pass=True)
            plain = _outcome(body, api_version=api_version, kind=kind, drop=drop, one_pass=False)
            assert fast == plain, f"seed {seed}, body {i}, drop={drop}, {api_version!r}/{kind!r}: {body!r}"
        for raw in split_list(body)[1]:
            data = bytes(raw)
            if bounded.out_of_bounds(data) or bounded.utf8_error(data):
                continue  # quarantined before any decode (the test above holds both paths to that)
            items += 1
            taken += sum(decode_object_bytes(data, drop, fill) is not None for drop in (False, True))
    assert items > 2 * _BODIES
    assert taken > items  # of 2 x items decodes, the one pass took more than half


def test_an_item_as_api_servers_write_it_gets_the_resource_type_written_in_as_the_plain_path_does() -> None:
    item = (b'{"metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"5","managedFields":'
            b'[{"manager":"kubelet","operation":"Update","time":"2024-05-01T12:00:00Z"}]},"spec":{}}')
    for drop in (False, True):
        fast = decode_object_bytes(item, drop, type_fill("v1", "Pod"))
        assert fast is not None
        plain = decode_object(item, api_version="v1", kind="Pod", drop_managed_fields=drop)
        assert slots(fast) == slots(plain)
        assert fast.raw.startswith(b'{"apiVersion":"v1","kind":"Pod","metadata":')
        assert ("managedFields" in msgspec.json.decode(fast.raw)["metadata"]) is not drop
        assert fast.change is not None
        assert fast.change.manager == "kubelet"


def test_bounds_quarantine_an_item_in_its_place_on_both_paths() -> None:
    ok = b'{"metadata":{"name":"ok","namespace":"ns","uid":"u1","resourceVersion":"1"}}'
    deep = b'{"metadata":{"name":"deep","namespace":"ns","uid":"u2","resourceVersion":"2"},"spec":' \
        + deep_value(MAX_DEPTH) + b"}"
    big = b'{"metadata":{"name":"big","namespace":"ns","uid":"u3","resourceVersion":"3"},"data":"' \
        + b"x" * _SIZE_BOUND + b'"}'
    bad = b'{"metadata":{"name":"bad","namespace":"ns","uid":"u4","resourceVersion":"4"},"data":"\xff"}'
    meta, raws = split_list(b'{"metadata":{"resourceVersion":"9"},"items":[' + b",".join([ok, deep, big, bad])
                            + b"]}")
    pages = [list_page(meta, raws, api_version="v1", kind="Pod", raw_objects=True, drop_managed_fields=True,
                       one_pass=one_pass) for one_pass in (True, False)]
    for page in pages:
        got = [(o.name, o.malformed) for o in page.items if type(o) is RawObject]
        assert got == [("ok", ""), ("deep", "depth"), ("big", "size"), ("bad", "encoding")]
    assert [slots(o) for o in pages[0].items] == [slots(o) for o in pages[1].items]
