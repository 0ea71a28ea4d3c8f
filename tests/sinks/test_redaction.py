"""Redaction: Secrets by default, custom redact / drop paths, managedFields, no mutation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson

from bridge.rawobject import RawObject, decode_object, dumps
from sinks.contract import EventType
from sinks.file import FileSink
from sinks.redaction import REDACTED, Redactor, keyed_mark
from tests.sinks import PODS, SECRETS, Acks, event, obj


def _secret() -> dict[str, Any]:
    s = obj(
        "creds", kind="Secret", data={"user": "YWRtaW4=", "pass": "aHVudGVy"}, stringData={"token": "t0k"}
    )
    s["type"] = "Opaque"
    s["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    return s


def test_secret_values_redacted_keys_kept_and_original_untouched() -> None:
    secret = _secret()
    before = copy.deepcopy(secret)
    out = Redactor().apply(secret, SECRETS)
    assert out == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "uid": "uid-creds", "resourceVersion": "1", "namespace": "default"},
        "data": {"user": REDACTED, "pass": REDACTED},
        "stringData": {"token": REDACTED},
        "type": "Opaque",
    }
    assert secret == before


def test_secret_redaction_can_be_disabled_and_only_applies_to_core_secrets() -> None:
    secret = _secret()
    out = Redactor(redact_secrets=False, drop_managed_fields=False).apply(secret, SECRETS)
    assert out is secret
    pod = obj("p", data={"x": "y"})
    assert Redactor(drop_managed_fields=False).apply(pod, PODS) is pod


def test_custom_redact_and_drop_paths_share_untouched_subtrees() -> None:
    pod = obj(
        "p",
        spec={
            "containers": [
                {"name": "a", "env": [{"name": "K", "value": "v1"}]},
                {"name": "b", "env": [{"name": "L", "value": "v2"}]},
            ],
            "nodeName": "n1",
        },
        status={"podIP": "10.0.0.1", "conditions": [{"type": "Ready"}]},
    )
    pod["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "{...}",
        "keep": "me",
    }
    before = copy.deepcopy(pod)
    r = Redactor(
        redact_paths=["spec.containers.*.env.*.value", "status.podIP"],
        drop_paths=[
            'metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]',
            "spec.nodeName",
        ],
    )
    out = r.apply(pod, PODS)
    assert out is not None
    assert [c["env"] for c in out["spec"]["containers"]] == [
        [{"name": "K", "value": REDACTED}],
        [{"name": "L", "value": REDACTED}],
    ]
    assert "nodeName" not in out["spec"]
    assert out["status"]["podIP"] == REDACTED
    assert out["metadata"]["annotations"] == {"keep": "me"}
    assert out["status"]["conditions"] is pod["status"]["conditions"]
    assert pod == before


def test_managed_fields_dropped_by_default_and_missing_paths_ignored() -> None:
    pod = obj("p")
    pod["metadata"]["managedFields"] = [{"manager": "m"}]
    out = Redactor(redact_paths=["spec.nothing.here"], drop_paths=["status.*"]).apply(pod, PODS)
    assert out is not None
    assert "managedFields" not in out["metadata"]
    assert "managedFields" in pod["metadata"]
    assert Redactor().apply(None, PODS) is None


def test_redacting_a_list_or_mapping_keeps_its_shape() -> None:
    o = {"a": [1, 2, 3], "b": {"x": 1, "y": {"z": 2}}}
    assert Redactor(redact_paths=["a", "b"], drop_managed_fields=False).apply(o, PODS) == {
        "a": [REDACTED] * 3,
        "b": {"x": REDACTED, "y": REDACTED},
    }


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _applied_secret() -> dict[str, Any]:
    """A Secret as ``kubectl apply`` leaves it: its values also inside the last-applied annotation."""
    applied = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "default", "annotations": {"team": "a"}},
        "data": {"user": "YWRtaW4="},
        "stringData": {"token": "plain-t0ken"},
    }
    s = obj("creds", kind="Secret", data={"user": "YWRtaW4="}, stringData={"token": "plain-t0ken"})
    s["metadata"]["annotations"] = {LAST_APPLIED: orjson.dumps(applied).decode(), "team": "a"}
    return s


def test_last_applied_annotation_of_a_secret_is_parsed_and_redacted() -> None:
    secret = _applied_secret()
    before = copy.deepcopy(secret)
    out = Redactor().apply(secret, SECRETS)
    assert out is not None
    annotations = out["metadata"]["annotations"]
    assert annotations["team"] == "a"
    applied = orjson.loads(annotations[LAST_APPLIED])
    assert applied["data"] == {"user": REDACTED}
    assert applied["stringData"] == {"token": REDACTED}
    assert applied["metadata"] == {"name": "creds", "namespace": "default", "annotations": {"team": "a"}}
    text = orjson.dumps(out)
    assert b"YWRtaW4=" not in text
    assert b"admin" not in text
    assert b"plain-t0ken" not in text
    assert secret == before
    # The same through the compact cache's RawObject.
    raw = Redactor().apply(RawObject.from_dict(secret), SECRETS)
    assert raw is not None
    assert orjson.loads(dumps(raw)) == out


def test_an_annotation_that_is_not_json_or_holds_a_value_elsewhere_is_redacted_whole() -> None:
    secret = _applied_secret()
    secret["metadata"]["annotations"][LAST_APPLIED] = '{"data": {"user": "YWRtaW4="'  # cut short
    secret["metadata"]["annotations"]["note"] = "the token is plain-t0ken"
    secret["metadata"]["annotations"]["decoded"] = "user=admin"
    out = Redactor().apply(secret, SECRETS)
    assert out is not None
    assert out["metadata"]["annotations"] == {
        LAST_APPLIED: REDACTED, "note": REDACTED, "decoded": REDACTED, "team": "a",
    }


async def test_a_destination_template_reads_the_redacted_labels(tmp_path: Path) -> None:
    """A label quoting a Secret value is redacted, and so is what a ``{labels[...]}`` template makes of
    it (a topic, a subject, a URL path)."""
    secret = _applied_secret()
    secret["metadata"]["labels"] = {"hint": "plain-t0ken", "app": "shop"}
    sink = FileSink.from_options("f", {"path": str(tmp_path / "e.jsonl"),
                                       "destination": "{labels[app]}/{labels[hint]}"})
    msg = sink._build(event(EventType.ADDED, secret, resource=SECRETS), lambda _: None)
    assert msg.destination == f"shop/{REDACTED}"
    pod = obj("p", labels={"hint": "plain-t0ken", "app": "shop"})
    assert sink._build(event(EventType.ADDED, pod), lambda _: None).destination == "shop/plain-t0ken"
    await sink.close()


BIG = 123456789012345678901234567890
"""Beyond 64 bits: orjson rounds it to a float on decode and refuses it on encode."""


def _big_applied_secret_bytes() -> bytes:
    """A Secret as the API server sends it, whose last-applied annotation (a string) holds an integer
    beyond 64 bits beside its values."""
    applied = (b'{"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds","namespace":"default",'
               b'"annotations":{"team":"a"}},"data":{"user":"YWRtaW4="},"spec":{"n":' + str(BIG).encode()
               + b',"nested":{"m":[-' + str(BIG).encode() + b']}}}')
    secret = obj("creds", kind="Secret", data={"user": "YWRtaW4="})
    secret["metadata"]["annotations"] = {LAST_APPLIED: applied.decode(), "team": "a"}
    return orjson.dumps(secret)


async def test_an_integer_beyond_64_bits_in_the_last_applied_annotation_stays_exact(tmp_path: Path) -> None:
    """The annotation is decoded, redacted and written again: its numbers come out as they were, never
    rounded to a float, through a sink's encoding of a Secret decoded from the API server's bytes."""
    secret = decode_object(_big_applied_secret_bytes())
    path = tmp_path / "e.jsonl"
    sink = FileSink.from_options("f", {"path": str(path)})
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, secret, resource=SECRETS), acks.cb("add"))
    assert await sink.flush(5)
    await sink.close()
    (line,) = path.read_bytes().splitlines()
    annotation = orjson.loads(line)["data"]["metadata"]["annotations"][LAST_APPLIED]
    assert f'"n":{BIG},' in annotation
    assert f'"m":[-{BIG}]' in annotation
    assert "YWRtaW4=" not in annotation
    assert f'"data":{{"user":"{REDACTED}"}}' in annotation


def test_a_spill_marks_an_integer_beyond_64_bits_under_a_redacted_path() -> None:
    """The spill's keyed mark of a redacted value that is an integer beyond 64 bits (a CRD's field
    under a ``redact`` path) is made, exactly, rather than failing the spill."""
    mark = keyed_mark(b"k" * 32)
    crd = obj("c", kind="Thing", spec={"a": BIG, "b": BIG + 1})
    out = Redactor(redact_paths=["spec.a", "spec.b"]).spill_form(crd, PODS, mark)
    assert out["spec"]["a"].startswith("<redacted:")
    assert out["spec"]["a"] != out["spec"]["b"]  # two different values, two marks


def test_a_last_applied_annotation_nested_deeper_than_the_bound_is_redacted_whole() -> None:
    """The annotation is a string inside the object: the decoders' depth bound does not reach into
    it. Nested deeper than that bound (orjson could not write it again), it is replaced whole
    rather than failing the event's encoding."""
    secret = _applied_secret()
    deep = '{"data":{"user":"YWRtaW4="},"spec":' + "[" * 600 + "]" * 600 + "}"
    secret["metadata"]["annotations"][LAST_APPLIED] = deep
    out = Redactor().apply(secret, SECRETS)
    assert out is not None
    assert out["metadata"]["annotations"][LAST_APPLIED] == REDACTED
    orjson.dumps(out)  # encodable
