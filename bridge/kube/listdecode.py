"""A List answer into a :class:`~bridge.contracts.ListPage`: its metadata and its items, decoded.

Splitting and decoding are two steps (:func:`split_list`, then :func:`list_page`) so that the
lister-watcher can read a page's continue token and ask for the next page before it decodes the
items, and drop the items another shard owns in between; :func:`decode_list` does both at once.

Invariants: items of a List carry no ``apiVersion``/``kind`` on the wire, and every item decoded here
gets the resource's (an object the bridge forwards describes itself); an item as API servers write
it becomes a RawObject in one msgspec pass (:func:`bridge.watchline.decode_object_bytes`), any
other the plain path's way (:func:`bridge.rawobject.decode_object`), the same RawObject for the same
bytes (``tests/api/test_list_one_pass.py``); each item is judged on its own: one that is not UTF-8
or is beyond the bounds (:mod:`bridge.kube.bounded`) is quarantined in its place and does not fail
the List; anything else that is not a List raises :class:`~bridge.kube.watchdecode.WatchDecodeError`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bridge.contracts import KubeObject, ListPage
from bridge.jsonbounds import MAX_DEPTH, MAX_OBJECT_BYTES, NOT_BRACKETS, exceeds_depth
from bridge.kube.bounded import ENCODING, deep_list, malformed_object, quarantined_item, utf8_error
from bridge.kube.watchdecode import DECODE_ERRORS, WatchDecodeError
from bridge.rawobject import RawObjectError, decode_object
from bridge.watchline import NO_FILL, decode_object_bytes, type_fill

__all__ = ["ListMeta", "decode_list", "list_page", "split_list"]


class ListMeta(msgspec.Struct):
    """What a List answer says of itself: the snapshot it was read at, and what is left of it."""

    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")
    remainingItemCount: int | None = None


class _RawList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] | None = None


_item_decoder = msgspec.json.Decoder(dict[str, Any])
_raw_list_decoder = msgspec.json.Decoder(_RawList)
_list_meta_decoder = msgspec.json.Decoder(ListMeta)
_BRACKETS = 2 * MAX_DEPTH
"""An item with at most this many brackets cannot nest deeper than the bound (the first step of
:func:`~bridge.jsonbounds.exceeds_depth`, done here without its call)."""


def split_list(body: bytes) -> tuple[ListMeta, list[msgspec.Raw | bytes]]:
    """A List answer's metadata and its items, still undecoded (one fast pass; a List nested too
    deep for that is split without recursion, :func:`bridge.kube.bounded.deep_list`). Each item's
    UTF-8 is checked on its own (:func:`list_page`): one item that is not UTF-8 does not fail the
    List."""
    try:
        raw_list = _raw_list_decoder.decode(body)
    except RecursionError:
        meta_raw, items = deep_list(body)
        try:
            meta = _list_meta_decoder.decode(meta_raw) if meta_raw else ListMeta()
        except DECODE_ERRORS as e:
            raise WatchDecodeError(f"not a List: {e}") from e
        return meta, list(items)
    except DECODE_ERRORS as e:
        raise WatchDecodeError(f"not a List: {e}") from e
    return raw_list.metadata, list(raw_list.items or [])


def list_page(
    meta: ListMeta,
    raws: list[msgspec.Raw | bytes],
    *,
    api_version: str,
    kind: str,
    raw_objects: bool,
    drop_managed_fields: bool,
    one_pass: bool = True,
) -> ListPage:
    """The page of a split List (:func:`split_list`): ``raws`` decoded in order, each a
    :class:`~bridge.rawobject.RawObject` (``raw_objects``) or a dict, with the resource's
    ``api_version`` and ``kind`` filled in where the item lacks them. A RawObject item laid out as
    API servers write it is decoded in one pass (:func:`bridge.watchline.decode_object_bytes`), any
    other by the plain path (:func:`~bridge.rawobject.decode_object`), which it equals;
    ``one_pass=False`` skips the one pass, for the differential test and the benchmarks only."""
    try:
        items = _items(raws, api_version, kind, raw_objects=raw_objects, drop=drop_managed_fields,
                       one_pass=one_pass)
    except (*DECODE_ERRORS, RawObjectError) as e:
        raise WatchDecodeError(f"not a List: {e}") from e
    return ListPage(
        items=items,
        resource_version=meta.resourceVersion,
        continue_token=meta.continue_ or None,
        remaining_item_count=meta.remainingItemCount,
    )


def _items(raws: list[msgspec.Raw | bytes], api_version: str, kind: str, *, raw_objects: bool, drop: bool,
           one_pass: bool) -> list[KubeObject]:
    """The decoded items of :func:`list_page` (an item beyond the bounds or not UTF-8 quarantined in
    its place). Runs once per List item: the checks are written out rather than called."""
    items: list[KubeObject] = []
    append = items.append
    fill = type_fill(api_version, kind) if raw_objects and one_pass else NO_FILL
    for raw in raws:
        data = raw if type(raw) is bytes else bytes(raw)
        if not data.isascii() and utf8_error(data):
            append(malformed_object(data, ENCODING, api_version=api_version, kind=kind))
            continue
        # Beyond the bounds (nearly never: one translate pass says so): quarantined.
        if len(data) > MAX_OBJECT_BYTES or (len(data.translate(None, NOT_BRACKETS)) > _BRACKETS
                                            and exceeds_depth(data)):
            quarantined = quarantined_item(data, api_version=api_version, kind=kind)
            if quarantined is not None:
                append(quarantined)
                continue
        if raw_objects:
            obj = decode_object_bytes(data, drop, fill) if one_pass else None
            if obj is None:
                obj = decode_object(data, api_version=api_version, kind=kind, drop_managed_fields=drop)
            append(obj)
            continue
        item = _item_decoder.decode(data)
        if api_version or kind:
            if "apiVersion" not in item:
                item["apiVersion"] = api_version
            if "kind" not in item:
                item["kind"] = kind
        append(item)
    return items


def decode_list(
    body: bytes,
    *,
    api_version: str = "",
    kind: str = "",
    raw_objects: bool = False,
    drop_managed_fields: bool = False,
    one_pass: bool = True,
) -> ListPage:
    """A List answer into a :class:`ListPage`. Items of a List carry no apiVersion/kind on the wire;
    they are filled in from the resource so that every object the bridge forwards is self-describing.

    ``raw_objects``: items become :class:`~bridge.rawobject.RawObject` (their bytes, metadata decoded),
    with ``metadata.managedFields`` cut out when ``drop_managed_fields``; otherwise dicts."""
    meta, raws = split_list(body)
    return list_page(meta, raws, api_version=api_version, kind=kind, raw_objects=raw_objects,
                     drop_managed_fields=drop_managed_fields, one_pass=one_pass)
