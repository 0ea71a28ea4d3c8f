"""What reads bytes from the network or from users, as fuzz targets with the properties that must hold.

Each target takes one input (bytes) and returns normally, or raises ``AssertionError`` (a property
broke) or any unexpected exception (a crash): the errors the code is meant to raise for bad input
(``WatchDecodeError``, ``CheckpointCorruptError``, ``ConfigurationError``) are part of "returns
normally". Hangs and unbounded allocations are the fuzzing engine's to catch (its timeout and memory
limit). ``bench/fuzz.py`` drives them with atheris (coverage-guided) for the long runs;
``tests/test_fuzz.py`` runs them for a short while with hypothesis in CI.

The properties:

* watch-line decoders (``msgspec``, ``msgspec-raw``, ``orjson``, ``raw-object`` with and without the
  managedFields cut): only ``WatchDecodeError``; every decoder that accepts a line gives the same
  event type and the same object as a full JSON decode of it; a RawObject's identity (name, namespace,
  uid, resourceVersion, has managedFields) is the one a full decode reads, and its bytes decode to the
  full decode's object (minus ``metadata.managedFields`` when cut);
* the list decoder: only ``WatchDecodeError``; the same for every item, dicts and RawObjects;
* the checkpoint loader: only ``CheckpointCorruptError``, for any bytes and for any body under a
  valid header and checksum (so that the body parser is reached, not only the checksum);
* the configuration loader: only ``ConfigurationError``, for any file content.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import orjson

from bridge.contracts import WatchEventType
from bridge.errors import ConfigurationError
from bridge.kube.listwatch import WATCH_EVENT_DECODERS, WatchDecodeError, decode_list, raw_object_decoder
from bridge.rawobject import RawObject
from bridge.storage.checkpoint import (
    FORMAT_VERSION,
    CheckpointCorruptError,
    decode_checkpoint,
    encode_checkpoint,
)

__all__ = ["SEEDS", "TARGETS"]

_full = msgspec.json.Decoder()
_RAW_CUT = raw_object_decoder(drop_managed_fields=True)
_DECODERS: dict[str, Callable[[bytes], Any]] = {**WATCH_EVENT_DECODERS, "raw-object-cut": _RAW_CUT}
_EVENT_TYPES = {t.value for t in WatchEventType}


def _reference(data: bytes) -> Any:
    """The full JSON decode every decoder is held to (``None`` when it is not JSON)."""
    try:
        return _full.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str, str, bool]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "", "", "", "", False
    return (str(meta.get("name") or ""), str(meta.get("namespace") or ""), str(meta.get("uid") or ""),
            str(meta.get("resourceVersion") or ""), "managedFields" in meta)


def _without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _as_orjson(value: Any) -> Any:
    """``value`` as orjson reads JSON: integers beyond 64 bits become floats (its documented
    behaviour; an API server never sends them, Go's are int64)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return float(value)
    if isinstance(value, dict):
        return {k: _as_orjson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_orjson(v) for v in value]
    return value


def _check_object(got: Any, want: Any, *, cut: bool, where: str) -> None:
    if not isinstance(want, dict):
        raise AssertionError(f"{where}: accepted an object that a full decode reads as {type(want).__name__}")
    expected = _without_managed_fields(want) if cut else want
    if type(got) is RawObject:
        if not isinstance(want.get("metadata"), dict):
            # A well-formed event whose object has no metadata mapping: the identity is empty, and
            # the reflector skips it (no name).
            assert got.identity[:4] == ("", "", "", ""), \
                f"{where}: identity {got.identity} without metadata"
            return
        ident = _identity(expected)
        assert got.identity == ident, f"{where}: RawObject identity {got.identity} != full decode {ident}"
        decoded = _reference(got.raw)
        assert decoded == expected, f"{where}: RawObject bytes decode to another object"
    else:
        assert dict(got) == expected, f"{where}: decoded object differs from the full decode"


def watch_line(data: bytes) -> None:
    want = _reference(data)
    for name, decode in _DECODERS.items():
        try:
            event = decode(data)
        except WatchDecodeError:
            continue
        where = f"decoder {name}"
        assert isinstance(want, dict), f"{where}: accepted a line that is not a JSON object"
        assert want.get("type") == event.type.value, f"{where}: event type {event.type} != {want.get('type')}"
        if event.type is WatchEventType.ERROR:
            assert isinstance(want.get("object"), dict), f"{where}: ERROR event without an object"
            expected_status = _as_orjson(want["object"]) if name == "orjson" else want["object"]
            assert dict(event.object) == expected_status, f"{where}: ERROR status differs"
            continue
        expected = _as_orjson(want.get("object")) if name == "orjson" else want.get("object")
        _check_object(event.object, expected, cut=name == "raw-object-cut", where=where)


def list_body(data: bytes) -> None:
    want = _reference(data)
    for raw_objects, cut in ((False, False), (True, False), (True, True)):
        try:
            page = decode_list(data, api_version="v1", kind="Pod", raw_objects=raw_objects,
                               drop_managed_fields=cut)
        except WatchDecodeError:
            continue
        where = f"decode_list(raw_objects={raw_objects}, cut={cut})"
        # A body that is not UTF-8 is taken when only items are not (each one quarantined alone):
        # it is held to what the body is read leniently (U+FFFD for each invalid byte).
        lenient = want if want is not None else _reference(data.decode("utf-8", "replace").encode())
        assert isinstance(lenient, dict), f"{where}: accepted a body that is not a JSON object"
        items = lenient.get("items") or []
        assert len(page.items) == len(items), f"{where}: {len(page.items)} items, full decode {len(items)}"
        for got, item in zip(page.items, items, strict=True):
            if type(got) is RawObject and got.malformed == "encoding":
                assert want is None, f"{where}: quarantined an item of a body that is UTF-8"
                assert not _is_utf8(got.quarantined), f"{where}: quarantined an item that is UTF-8"
                continue
            filled = {"apiVersion": "v1", "kind": "Pod", **item} if isinstance(item, dict) else item
            _check_object(got, filled, cut=cut, where=where)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def checkpoint_bytes(data: bytes) -> None:
    for candidate in (data, _framed(data)):
        try:
            cp = decode_checkpoint(candidate)
        except CheckpointCorruptError:
            continue
        assert cp.resource_version, "a loaded checkpoint has a resourceVersion"
        # What loads must encode and load again to the same checkpoint.
        again = decode_checkpoint(encode_checkpoint(cp))
        assert again == cp, "checkpoint does not survive encode/decode"


def _framed(body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest().encode()
    header = b"kube-event-bridge-checkpoint %d %d %s" % (FORMAT_VERSION, len(body), digest)
    return header + b"\n" + body


_CONFIG_DIR = tempfile.mkdtemp(prefix="keb-fuzz-config-")
_CONFIG_PATH = Path(_CONFIG_DIR) / "config.yaml"


def config_file(data: bytes) -> None:
    _CONFIG_PATH.write_bytes(data)
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("KEB_")}
    try:
        load_config(_CONFIG_PATH)
    except ConfigurationError:
        pass
    finally:
        os.environ.update(saved)


def _load_config_lazily() -> Callable[[Path], Any]:
    from bridge.service.config import load_config as load  # the service layer, only for this target

    return load


load_config = _load_config_lazily()

TARGETS: dict[str, Callable[[bytes], None]] = {
    "watch-line": watch_line,
    "list": list_body,
    "checkpoint": checkpoint_bytes,
    "config": config_file,
}


def _seeds() -> dict[str, list[bytes]]:
    meta = {"name": "web-1", "namespace": "prod", "uid": "6f1c", "resourceVersion": "812",
            "labels": {"app": "web"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}], "nodeName": "n1"},
           "status": {"phase": "Running"}}
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": "too old resource version: 1 (5)", "reason": "Expired", "code": 410}
    lines = [orjson.dumps({"type": t, "object": pod}) for t in ("ADDED", "MODIFIED", "DELETED")]
    lines += [
        orjson.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
            "resourceVersion": "900", "annotations": {"k8s.io/initial-events-end": "true"}}}}),
        orjson.dumps({"type": "ERROR", "object": status}),
        orjson.dumps({"object": pod, "type": "ADDED"}, option=orjson.OPT_INDENT_2),
        b'{"type":"ADDED","object":{"metadata":{"name":"a","managedFields":[],"name":"b"}}}',
    ]
    item = {k: v for k, v in pod.items() if k not in ("apiVersion", "kind")}
    lists = [
        orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "812",
                      "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", "remainingItemCount": 3},
                      "items": [item, {**item, "metadata": {**meta, "name": "web-2"}}]}),
        b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}',
    ]
    cp = _framed(orjson.dumps({"informer_id": "pods.all.0123456789ab", "resource_version": "812",
                               "written_at": 1700000000.5, "objects": {"prod/web-1": ["6f1c", "812"]},
                               "ahead": {"prod/web-2": ["7a2d", "813", True]}}))
    configs = [
        b"resources:\n  - resource: pods\n    namespace: prod\n    label_selector: 'app in (web,api),x>1'\n"
        b"sinks:\n  - {name: out, kind: file, path: /tmp/keb-fuzz.jsonl}\n"
        b"checkpoint: {store: file, interval: 5}\n",
        b"resources: [{resource: deployments.apps, field_selector: 'metadata.name=a'}]\n"
        b"sinks: [{name: hook, kind: webhook, url: 'https://example.com/x', auth: {bearer_token: t}}]\n"
        b"kubernetes: {watch_list: true, page_size: 100}\n",
    ]
    return {"watch-line": lines, "list": lists, "checkpoint": [cp, cp[:40]], "config": configs}


SEEDS = _seeds()
