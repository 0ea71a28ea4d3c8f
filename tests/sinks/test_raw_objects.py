"""Sinks fed RawObjects (objects kept as their JSON bytes) behave as when fed the decoded dicts: the
change filter's byte comparison agrees with the tree comparison, redaction leaves nothing secret and
passes untouched objects through as they are, and the CloudEvents written (structured and binary,
every payload mode) are the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.informer.transform import drop_managed_fields
from bridge.rawobject import RawObject, decode_object
from sinks.base import OutgoingMessage
from sinks.cloudevents import decode_binary
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, ResourceRef
from sinks.file import FileSink
from sinks.filters import ChangeFilter
from sinks.options import DEFAULT_IGNORE_PATHS, SinkOptions
from sinks.payload import apply_merge_patch
from sinks.redaction import REDACTED, Redactor
from tests.sinks import PODS, SECRETS, T0, Acks, RecordingSink

CONFIGMAPS = ResourceRef(group="", version="v1", resource="configmaps", kind="ConfigMap")


def raw(obj: dict[str, Any], *, keep_managed_fields: bool = False) -> RawObject:
    """The object as the informer hands it over: decoded from its wire bytes."""
    return decode_object(orjson.dumps(obj), drop_managed_fields=not keep_managed_fields)


def pod(name: str = "web-0", rv: str = "1", *, labels: dict[str, str] | None = None,
        mf: bool = True, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}",
                            "resourceVersion": rv, "labels": labels if labels is not None else {"app": "web"}}
    if mf:
        meta["managedFields"] = [{"manager": "kubelet", "operation": "Update", "time": f"t{rv}"}]
    body = {"spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx:1"}]},
            "status": {"phase": "Running"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, **body, **extra}


# ---------------------------------------------------------------------------------- change filter

_values = st.sampled_from(["a", "b", '"resourceVersion":"1"', "é", "1", "2"])


@st.composite
def update_pair(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two states of one object as one API server writes them (members in a fixed order; a member
    that stays keeps its place), differing in any of: resourceVersion, managedFields, labels,
    annotations, spec, a nested resourceVersion in the spec, status."""
    labels = draw(st.dictionaries(st.sampled_from(["app", "tier", "resourceVersion"]), _values, max_size=3))
    rv = draw(st.sampled_from(["1", "2", "10"]))

    def state(rv: str, labels: dict[str, str], manager: str, node: str, ref_rv: str,
              phase: str | None, note: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": rv,
                                "labels": labels}
        if note is not None:
            meta["annotations"] = {"note": note}
        if manager:
            meta["managedFields"] = [{"manager": manager}]
        obj: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event", "metadata": meta,
            "involvedObject": {"kind": "Pod", "resourceVersion": ref_rv},
            "spec": {"nodeName": node},
        }
        if phase is not None:
            obj["status"] = {"phase": phase}
        return obj

    old_args = (rv, labels, draw(st.sampled_from(["", "m1"])), "n1", draw(_values),
                draw(st.one_of(st.none(), _values)), draw(st.one_of(st.none(), _values)))
    new_labels = dict(labels)
    if draw(st.booleans()):
        key = draw(st.sampled_from(["app", "tier", "resourceVersion"]))
        if key in new_labels and draw(st.booleans()):
            del new_labels[key]
        else:
            new_labels[key] = draw(_values)
    new_args = (
        draw(st.sampled_from([rv, rv, "11", "2"])),
        new_labels,
        draw(st.sampled_from(["", "m1", "m2"])),
        draw(st.sampled_from(["n1", "n1", "n2"])),
        draw(st.one_of(st.just(old_args[4]), _values)),
        draw(st.one_of(st.just(old_args[5]), st.none(), _values)),
        draw(st.one_of(st.just(old_args[6]), st.none(), _values)),
    )
    if draw(st.integers(0, 3)) == 0:  # bookkeeping only: the byte comparison's short cut
        new_args = (new_args[0], labels, new_args[2], *old_args[3:])
    return state(*old_args), state(*new_args)


@settings(max_examples=200, deadline=None)
@given(update_pair())
def test_byte_comparison_agrees_with_the_tree_comparison(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    old, new = pair
    cf = ChangeFilter(ignore_paths=DEFAULT_IGNORE_PATHS)
    expected = cf.interesting(old, new)
    assert cf.interesting(raw(old), raw(new)) == expected
    assert cf.interesting(drop_managed_fields(old), drop_managed_fields(new)) == expected
    # Mixed: one side a dict, the other bytes (the tree comparison applies).
    assert cf.interesting(old, raw(new)) == expected
    assert cf.interesting(raw(old), new) == expected
    # RawObjects still holding managedFields are compared as trees, with the same answer.
    assert cf.interesting(raw(old, keep_managed_fields=True), raw(new, keep_managed_fields=True)) == expected


@settings(max_examples=100, deadline=None)
@given(update_pair(), st.randoms(use_true_random=False))
def test_byte_comparison_never_loses_an_update_whatever_the_member_order(
    pair: tuple[dict[str, Any], dict[str, Any]], rnd: Any
) -> None:
    """Members in any order (the first resourceVersion in the bytes need not be metadata's): bytes
    laid out unlike the API server's may cost a redundant update, never a lost one."""

    def shuffled(obj: dict[str, Any], order: list[str]) -> dict[str, Any]:
        return {k: obj[k] for k in order if k in obj}

    old, new = pair
    top = ["apiVersion", "kind", "metadata", "involvedObject", "spec", "status"]
    rnd.shuffle(top)
    meta_order = ["labels", "name", "namespace", "uid", "resourceVersion", "annotations", "managedFields"]
    rnd.shuffle(meta_order)
    old = shuffled({**old, "metadata": shuffled(old["metadata"], meta_order)}, top)
    new = shuffled({**new, "metadata": shuffled(new["metadata"], meta_order)}, top)
    cf = ChangeFilter(ignore_paths=DEFAULT_IGNORE_PATHS)
    if cf.interesting(old, new):
        assert cf.interesting(raw(old), raw(new))


def test_change_filter_on_raw_objects_examples() -> None:
    cf = ChangeFilter(ignore_paths=DEFAULT_IGNORE_PATHS)
    v1 = pod(rv="1")
    assert not cf.interesting(raw(v1), raw(v1))
    assert not cf.interesting(raw(v1), raw(pod(rv="2")))
    assert not cf.interesting(raw(pod(rv="9")), raw(pod(rv="10")))  # lengths differ
    assert cf.interesting(raw(v1), raw(pod(rv="2", labels={"app": "db"})))
    assert cf.interesting(raw(v1), raw(pod(rv="1", labels={"app": "db"})))
    assert cf.interesting(raw(v1), raw(pod(rv="2", labels={"app": "web", "new": "x"})))
    assert cf.interesting(raw(v1), raw(pod(rv="2", status={"phase": "Failed"})))
    # A label whose value is the resourceVersion changing along with it is a change.
    assert cf.interesting(raw(pod(rv="1", labels={"v": "1"})), raw(pod(rv="2", labels={"v": "2"})))
    # Without old state every update is interesting; so are non-RawObject mixes.
    assert cf.interesting(None, raw(v1))
    assert not cf.interesting(v1, raw(pod(rv="2")))


def test_raw_objects_keeping_managed_fields_differing_only_there_are_not_interesting() -> None:
    cf = ChangeFilter(ignore_paths=DEFAULT_IGNORE_PATHS)
    old = raw(pod(rv="1"), keep_managed_fields=True)
    new = raw(pod(rv="2"), keep_managed_fields=True)
    assert old.managed_fields
    assert new.managed_fields
    assert old["metadata"]["managedFields"] != new["metadata"]["managedFields"]
    assert not cf.interesting(old, new)
    assert cf.interesting(old, raw(pod(rv="2", labels={"app": "db"}), keep_managed_fields=True))
    # One side cut, the other not: still only managedFields and the resourceVersion differ.
    assert not cf.interesting(raw(pod(rv="1")), new)


def test_custom_ignore_and_only_paths_fall_back_to_the_tree_comparison() -> None:
    cf = ChangeFilter(ignore_paths=[*DEFAULT_IGNORE_PATHS, "status"])
    v1 = pod(rv="1")
    status_only = pod(rv="2", status={"phase": "Succeeded"})
    assert not cf.interesting(raw(v1), raw(status_only))
    assert not cf.interesting(raw(v1, keep_managed_fields=True), raw(status_only, keep_managed_fields=True))
    assert cf.interesting(raw(v1), raw(pod(rv="2", labels={"app": "db"}, status={"phase": "Succeeded"})))

    rv_counts = ChangeFilter(ignore_paths=["metadata.managedFields"])  # resourceVersion not ignored
    assert rv_counts.interesting(raw(v1), raw(pod(rv="2")))
    assert not rv_counts.interesting(raw(v1), raw(pod(rv="1")))

    spec_only = ChangeFilter(ignore_paths=DEFAULT_IGNORE_PATHS, only_paths=["spec"])
    assert not spec_only.interesting(raw(v1), raw(pod(rv="2", labels={"app": "db"})))
    moved = pod(rv="2")
    moved["spec"] = {**moved["spec"], "nodeName": "n2"}
    assert spec_only.interesting(raw(v1), raw(moved))

    by_label = ChangeFilter(only_paths=['metadata.labels["app"]'])
    assert by_label.interesting(raw(v1), raw(pod(rv="1", labels={"app": "db"})))
    assert not by_label.interesting(raw(v1), raw(pod(rv="1", labels={"app": "web", "x": "y"})))


# ---------------------------------------------------------------------------------- redaction

SECRET_VALUES = ("YWRtaW4=", "aHVudGVy", "t0k-s3cr3t")


def secret(rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "default", "uid": "uid-creds", "resourceVersion": rv,
                     "managedFields": [{"manager": "kubectl"}]},
        "data": {"user": SECRET_VALUES[0], "pass": SECRET_VALUES[1]},
        "stringData": {"token": SECRET_VALUES[2]},
        "type": "Opaque",
    }


def test_secret_raw_object_is_redacted() -> None:
    s = raw(secret())
    out = Redactor().apply(s, SECRETS)
    assert out == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "default", "uid": "uid-creds", "resourceVersion": "1"},
        "data": {"user": REDACTED, "pass": REDACTED},
        "stringData": {"token": REDACTED},
        "type": "Opaque",
    }
    assert s["data"]["pass"] == SECRET_VALUES[1]  # the shared object is untouched
    assert Redactor().apply(raw(secret(), keep_managed_fields=True), SECRETS) == out
    kept = Redactor(redact_secrets=False).apply(s, SECRETS)
    assert kept is s


def test_untouched_raw_object_passes_through_as_is() -> None:
    cm = raw({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
              "data": {"k": "v"}})
    assert Redactor().apply(cm, CONFIGMAPS) is cm
    assert cm._obj is None  # not even decoded
    # A Secret-looking body under another resource is not a Secret.
    assert Redactor().apply(raw(secret()), CONFIGMAPS) == drop_managed_fields(secret())


def test_raw_object_still_holding_managed_fields_loses_them() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "c", "namespace": "ns", "managedFields": [{"manager": "m"}]},
          "data": {"k": "v"}}
    holding = raw(cm, keep_managed_fields=True)
    out = Redactor().apply(holding, CONFIGMAPS)
    assert out is not holding
    assert out == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
                   "data": {"k": "v"}}
    assert "managedFields" in holding["metadata"]
    assert Redactor(drop_managed_fields=False).apply(holding, CONFIGMAPS) is holding
    # User drop / redact paths apply to RawObjects without managedFields too.
    cut = raw(cm)
    assert Redactor(drop_paths=["data"]).apply(cut, CONFIGMAPS) == {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}
    }
    assert Redactor(redact_paths=["data.k"]).apply(cut, CONFIGMAPS) == {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
        "data": {"k": REDACTED},
    }


# ---------------------------------------------------------------------------------- sinks


def change(type_: EventType, obj: Any, old: Any = None, resource: ResourceRef = PODS) -> ChangeEvent:
    return ChangeEvent(type=type_, resource=resource, cluster="prod", obj=obj, old=old, time=T0)


async def write_events(path: Path, events: list[ChangeEvent], *, filtered: tuple[int, ...] = (),
                       **options: Any) -> list[bytes]:
    """The lines a file sink writes for ``events`` (every one delivered but those ``filtered``)."""
    sink = FileSink.from_options("f", {"path": str(path), **options})
    await sink.start()
    acks = Acks()
    for i, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(str(i)))
    assert await sink.flush(5)
    await sink.close()
    assert sorted(acks.outcomes) == [
        (str(i), DeliveryOutcome.FILTERED if i in filtered else DeliveryOutcome.DELIVERED)
        for i in range(len(events))
    ]
    return path.read_bytes().splitlines()  # noqa: ASYNC240


async def test_file_sink_never_writes_secret_values(tmp_path: Path) -> None:
    events = [
        change(EventType.ADDED, raw(secret("1")), resource=SECRETS),
        change(EventType.UPDATED, raw(secret("2")), raw(secret("1")), resource=SECRETS),
        change(EventType.DELETED, raw(secret("2"), keep_managed_fields=True), resource=SECRETS),
    ]
    for payload in ("object", "object_and_old", "merge_patch"):
        lines = await write_events(tmp_path / f"{payload}.jsonl", events, payload=payload,
                                   change_filter={"ignore_paths": []})
        assert len(lines) == 3
        data = b"\n".join(lines)
        for value in SECRET_VALUES:
            assert value.encode() not in data
        assert b"managedFields" not in data
        first = orjson.loads(lines[0])["data"]
        assert (first["object"] if payload == "object_and_old" else first)["data"] == {
            "user": REDACTED, "pass": REDACTED
        }


@pytest.mark.parametrize("payload", ["object", "object_and_old", "merge_patch"])
async def test_file_sink_writes_the_same_cloudevents_for_dicts_and_raw_objects(
    tmp_path: Path, payload: str
) -> None:
    v1 = pod(rv="1", note='"metadata": {"managedFields": []} \\ é 🙂')
    v2 = pod(rv="2", labels={"app": "web", "tier": "1"}, spec={"nodeName": "n2"})
    v3 = pod(rv="3", labels={"app": "web", "tier": "1"}, spec={"nodeName": "n2"})  # only the rv changed
    as_dicts = [change(EventType.ADDED, v1), change(EventType.UPDATED, v2, v1),
                change(EventType.UPDATED, v3, v2), change(EventType.DELETED, v3)]
    as_raw = [change(EventType.ADDED, raw(v1)), change(EventType.UPDATED, raw(v2), raw(v1)),
              change(EventType.UPDATED, raw(v3), raw(v2)), change(EventType.DELETED, raw(v3))]
    kept = [change(EventType.ADDED, raw(v1, keep_managed_fields=True)),
            change(EventType.UPDATED, raw(v2, keep_managed_fields=True), raw(v1, keep_managed_fields=True)),
            change(EventType.UPDATED, raw(v3, keep_managed_fields=True), raw(v2, keep_managed_fields=True)),
            change(EventType.DELETED, raw(v3, keep_managed_fields=True))]
    expected = await write_events(tmp_path / "dicts.jsonl", as_dicts, filtered=(2,), payload=payload)
    assert len(expected) == 3  # the resourceVersion-only update is filtered
    assert await write_events(tmp_path / "raw.jsonl", as_raw, filtered=(2,), payload=payload) == expected
    assert await write_events(tmp_path / "kept.jsonl", kept, filtered=(2,), payload=payload) == expected
    ces = [orjson.loads(line) for line in expected]
    assert b'"managedFields":[' not in b"".join(expected)  # the member (the note only mentions it)
    assert [(ce["type"], ce["resourceversion"]) for ce in ces] == [
        ("io.kube-event-bridge.added", "1"), ("io.kube-event-bridge.updated", "2"),
        ("io.kube-event-bridge.deleted", "3"),
    ]
    if payload == "merge_patch":
        assert ces[1]["datacontenttype"] == "application/merge-patch+json"
        assert ces[1]["data"] == {"metadata": {"resourceVersion": "2", "labels": {"tier": "1"}},
                                  "spec": {"nodeName": "n2", "containers": None}, "note": None}
        assert apply_merge_patch(ces[0]["data"], ces[1]["data"]) == drop_managed_fields(v2)
    elif payload == "object_and_old":
        assert ces[1]["data"] == {"object": drop_managed_fields(v2), "oldObject": drop_managed_fields(v1)}
    else:
        assert ces[0]["data"] == drop_managed_fields(v1)


async def sent_messages(events: list[ChangeEvent], **options: Any) -> list[OutgoingMessage]:
    sink = RecordingSink(name="rec", options=SinkOptions.from_mapping("rec", options))
    await sink.start()
    acks = Acks()
    for i, ev in enumerate(events):
        await sink.deliver(ev, acks.cb(str(i)))
    assert await sink.flush(5)
    await sink.close()
    assert acks.of(DeliveryOutcome.DELIVERED) == [str(i) for i in range(len(events))]
    return sink.sent


@pytest.mark.parametrize("payload", ["object", "object_and_old", "merge_patch"])
async def test_binary_mode_headers_and_body_are_the_same_for_dicts_and_raw_objects(payload: str) -> None:
    v1, v2 = pod(rv="1"), pod(rv="2", labels={"app": "db"})
    expected = await sent_messages(
        [change(EventType.ADDED, v1), change(EventType.UPDATED, v2, v1)],
        content_mode="binary", payload=payload,
    )
    got = await sent_messages(
        [change(EventType.ADDED, raw(v1)), change(EventType.UPDATED, raw(v2), raw(v1))],
        content_mode="binary", payload=payload,
    )
    assert [(m.key, m.headers, m.body) for m in got] == [(m.key, m.headers, m.body) for m in expected]
    added = got[0]
    assert added.headers["ce-subject"] == "default/web-0"
    assert added.headers["ce-resourceversion"] == "1"
    assert added.headers["content-type"] == "application/json"
    body = orjson.loads(added.body)
    assert body == (drop_managed_fields(v1) if payload != "object_and_old"
                    else {"object": drop_managed_fields(v1), "oldObject": None})
    if payload == "object":
        assert added.body == raw(v1).raw  # the object's own bytes are the body
    ce = decode_binary(got[1].headers, got[1].body)
    assert ce["type"] == "io.kube-event-bridge.updated"
    assert ce == decode_binary(expected[1].headers, expected[1].body)
