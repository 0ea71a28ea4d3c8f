"""The CloudEvents envelope: every attribute, both content modes, Knative compatibility, ids."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.cloudevents import (
    LEFT_SELECTOR,
    cloudevent_of,
    decode_binary,
    decode_structured,
    encode_binary,
    encode_structured,
    event_id,
    object_event_id,
    rfc3339,
    to_cloudevent,
)
from sinks.contract import (
    ChangeEvent,
    DeliveryOutcome,
    EventType,
    GapInfo,
    ResourceRef,
    SinkConfigError,
    SnapshotInfo,
)
from sinks.file import FileSink
from tests.sinks import DEPLOYMENTS, NODES, T0, Acks, event, marker, obj


def test_added_event_has_every_attribute() -> None:
    o = obj("web-0", uid="u-1", rv="42")
    ce = to_cloudevent(event(EventType.ADDED, o))
    assert ce == {
        "specversion": "1.0",
        "id": hashlib.sha256(b"u-1\x0042\x00added\x00").hexdigest()[:32],
        "source": "/clusters/prod/api/v1/pods",
        "type": "io.kube-event-bridge.added",
        "subject": "default/web-0",
        "time": "2023-11-14T22:13:20.250000Z",
        "datacontenttype": "application/json",
        "cluster": "prod",
        "kind": "Pod",
        "apiversion": "v1",
        "namespace": "default",
        "name": "web-0",
        "uid": "u-1",
        "resourceversion": "42",
        "data": o,
    }
    assert ce["data"] is o  # no copy on the fast path


def test_group_resources_cluster_scoped_and_flags() -> None:
    dep = to_cloudevent(event(EventType.UPDATED, obj("api", namespace="shop"), resource=DEPLOYMENTS))
    assert dep["source"] == "/clusters/prod/apis/apps/v1/deployments"
    assert dep["apiversion"] == "apps/v1"
    assert dep["type"] == "io.kube-event-bridge.updated"
    node = to_cloudevent(
        event(EventType.DELETED, obj("n1", namespace=None), resource=NODES, final_state_unknown=True)
    )
    assert node["subject"] == "n1"
    assert "namespace" not in node
    assert node["finalstateunknown"] == "true"
    assert node["type"] == "io.kube-event-bridge.deleted"


def test_snapshot_markers_and_sync_events() -> None:
    snap = SnapshotInfo(id="s-1", resource_version="900")
    begin = to_cloudevent(marker(EventType.SNAPSHOT_BEGIN, snap))
    assert begin["type"] == "io.kube-event-bridge.snapshot.begin"
    assert begin["snapshotid"] == "s-1"
    assert begin["snapshotrv"] == "900"
    assert not {"subject", "uid", "snapshotcount"} & begin.keys()
    assert begin["data"] is None
    end = to_cloudevent(
        marker(EventType.SNAPSHOT_END, SnapshotInfo(id="s-1", resource_version="900", count=3))
    )
    assert end["snapshotcount"] == "3"
    assert begin["id"] != end["id"]
    s1 = to_cloudevent(event(EventType.SYNC, obj("a", rv="5"), snapshot=snap))
    s2 = to_cloudevent(
        event(EventType.SYNC, obj("a", rv="5"), snapshot=SnapshotInfo(id="s-2", resource_version="950"))
    )
    assert s1["type"] == "io.kube-event-bridge.sync"
    assert s1["id"] != s2["id"]  # two resyncs of an unchanged object are distinct events


def test_ids_are_deterministic_and_distinguish_type_and_version() -> None:
    a = event(EventType.UPDATED, obj("a", uid="u", rv="7"))
    assert event_id(a) == event_id(event(EventType.UPDATED, obj("a", uid="u", rv="7"), time=T0 + 99))
    assert event_id(a) != event_id(event(EventType.UPDATED, obj("a", uid="u", rv="8")))
    assert event_id(a) != event_id(event(EventType.DELETED, obj("a", uid="u", rv="7")))
    assert len(event_id(a)) == 32


def test_knative_compat_mode() -> None:
    o = obj("web-0", uid="u-1", rv="42")
    ce = to_cloudevent(event(EventType.ADDED, o), compat="knative", knative_source="https://10.96.0.1:443")
    assert ce["type"] == "dev.knative.apiserver.resource.add"
    assert ce["source"] == "https://10.96.0.1:443"
    assert ce["subject"] == "/apis/v1/namespaces/default/pods/web-0"
    assert (ce["kind"], ce["name"], ce["namespace"]) == ("Pod", "web-0", "default")
    upd = to_cloudevent(
        event(EventType.UPDATED, obj("api", namespace="shop"), resource=DEPLOYMENTS), compat="knative"
    )
    assert upd["type"] == "dev.knative.apiserver.resource.update"
    assert upd["subject"] == "/apis/apps/v1/namespaces/shop/deployments/api"
    assert upd["source"] == "https://kubernetes.default.svc"
    assert (
        to_cloudevent(event(EventType.DELETED), compat="knative")["type"]
        == "dev.knative.apiserver.resource.delete"
    )
    assert (
        to_cloudevent(event(EventType.SYNC), compat="knative")["type"]
        == "dev.knative.apiserver.resource.update"
    )
    # Cluster-scoped objects: Knative's createSelfLink always writes namespaces/{namespace}/, and its
    # makeEvent always sets the namespace extension (empty for them).
    node = to_cloudevent(event(EventType.ADDED, obj("n1", namespace=None), resource=NODES), compat="knative")
    assert node["subject"] == "/apis/v1/namespaces//nodes/n1"
    assert node["namespace"] == ""
    assert (node["kind"], node["apiversion"], node["name"]) == ("Node", "v1", "n1")
    # The resource in the subject is Knative's guess from the kind (meta.UnsafeGuessKindToResource).
    for kind, guessed in (("Endpoints", "endpoints"), ("NetworkPolicy", "networkpolicies"),
                          ("Ingress", "ingresses"), ("ConfigMap", "configmaps")):
        res = ResourceRef(group="", version="v1", resource="whatever", kind=kind)
        ce = to_cloudevent(event(EventType.ADDED, obj("x"), resource=res), compat="knative")
        assert ce["subject"] == f"/apis/v1/namespaces/default/{guessed}/x"


def test_knative_reference_mode() -> None:
    ev = event(EventType.UPDATED, obj("api", namespace="shop", kind="Deployment", api_version="apps/v1"),
               resource=DEPLOYMENTS)
    ce = to_cloudevent(ev, compat="knative", knative_mode="reference")
    assert ce["type"] == "dev.knative.apiserver.ref.update"
    assert ce["subject"] == "/apis/apps/v1/namespaces/shop/deployments/api"
    assert ce["data"] == {"kind": "Deployment", "namespace": "shop", "name": "api", "apiVersion": "apps/v1"}
    assert to_cloudevent(event(EventType.ADDED), compat="knative", knative_mode="reference")["type"] == (
        "dev.knative.apiserver.ref.add")
    deleted = to_cloudevent(event(EventType.DELETED, obj("n1", namespace=None), resource=NODES),
                            compat="knative", knative_mode="reference")
    assert deleted["type"] == "dev.knative.apiserver.ref.delete"
    assert deleted["data"] == {"kind": "Node", "name": "n1", "apiVersion": "v1"}  # omitempty namespace


async def test_knative_mode_sends_no_snapshot_markers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = FileSink.from_options("f", {"path": str(path), "compat": "knative"})
    acks = Acks()
    snap = SnapshotInfo(id="s", resource_version="1")
    await sink.deliver(marker(EventType.SNAPSHOT_BEGIN, snap), acks.cb("begin"))
    await sink.deliver(event(EventType.SYNC, obj("a"), snapshot=snap), acks.cb("sync"))
    await sink.deliver(marker(EventType.SNAPSHOT_END, SnapshotInfo(id="s", resource_version="1", count=1)),
                       acks.cb("end"))
    assert await sink.flush(5)
    await sink.close()
    assert sorted(acks.outcomes) == [("begin", DeliveryOutcome.FILTERED), ("end", DeliveryOutcome.FILTERED),
                                     ("sync", DeliveryOutcome.DELIVERED)]
    (line,) = path.read_bytes().splitlines()
    assert orjson.loads(line)["type"] == "dev.knative.apiserver.resource.update"
    with pytest.raises(SinkConfigError, match=r"payload: compat 'knative' sends the object"):
        FileSink.from_options("f", {"path": str(path), "compat": "knative", "payload": "merge_patch"})


def test_extensions_are_sanitised_and_never_override() -> None:
    ce = to_cloudevent(event(extensions={"Trace-Parent": "00-abc", "id": "nope", "__": "x"}))
    assert ce["traceparent"] == "00-abc"
    assert ce["id"] != "nope"
    assert "" not in ce


def test_structured_round_trip() -> None:
    ce = to_cloudevent(event(EventType.ADDED, obj("a")))
    body = encode_structured(ce)
    assert decode_structured(body) == orjson.loads(orjson.dumps(ce))


def test_binary_round_trip_with_percent_encoding_on_http() -> None:
    o = obj("café", namespace="ns")
    ce = to_cloudevent(event(EventType.UPDATED, o, extensions={"note": 'a "quoted" 100%'}))
    headers, body = encode_binary(ce, "ce-")
    assert headers["content-type"] == "application/json"
    assert headers["ce-subject"] == "ns/caf%C3%A9"
    assert headers["ce-note"] == "a %22quoted%22 100%25"
    assert all(v.isascii() for v in headers.values())
    assert orjson.loads(body) == o
    back = decode_binary({k.upper(): v for k, v in headers.items()}, body, "ce-")
    assert back == ce


def test_kafka_binary_headers_are_utf8_without_percent_encoding() -> None:
    """The Kafka binding carries header values as bytes: percent-encoding is an HTTP-only rule, and a
    Kafka consumer (the SDK's binding among them) would read ``%C3%A9`` literally."""
    o = obj("café", namespace="ns")
    ce = to_cloudevent(event(EventType.UPDATED, o, extensions={"note": 'a "quoted" 100%'}))
    headers, body = encode_binary(ce, "ce_")
    assert headers["ce_subject"] == "ns/café"
    assert headers["ce_note"] == 'a "quoted" 100%'
    assert decode_binary({k.upper(): v for k, v in headers.items()}, body, "ce_") == ce


def test_rfc3339() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"
    assert rfc3339(T0) == "2023-11-14T22:13:20.250000Z"
    assert rfc3339(T0 + 0.5) == "2023-11-14T22:13:20.750000Z"
    assert rfc3339(0.9999999) == "1970-01-01T00:00:01.000000Z"
    assert rfc3339(1_704_067_199.5) == "2023-12-31T23:59:59.500000Z"
    assert rfc3339(1_704_067_200.0) == "2024-01-01T00:00:00.000000Z"


def test_a_delete_id_depends_on_uid_and_cluster_alone() -> None:
    """A uid is deleted once: the delete seen on the watch and one inferred by a relist (another
    resourceVersion, final state unknown) are the same event for a consumer deduplicating by id."""
    real = event(EventType.DELETED, obj("a", uid="u", rv="9"))
    inferred = event(EventType.DELETED, obj("a", uid="u", rv="5"), final_state_unknown=True)
    assert event_id(real) == event_id(inferred)
    assert event_id(real) == hashlib.sha256(b"prod\x00u\x00deleted").hexdigest()[:32]
    assert event_id(real) != event_id(event(EventType.DELETED, obj("a", uid="v", rv="9")))
    other_cluster = event(EventType.DELETED, obj("a", uid="u", rv="9"))
    other_cluster.cluster = "elsewhere"
    assert event_id(real) != event_id(other_cluster)


def test_a_selector_exit_keeps_an_id_of_its_own() -> None:
    """An object that left the selector lives on: it may come back and leave again, and each exit
    must reach a consumer that drops repeated ids (the uid's final delete is another event still)."""
    first = event(EventType.DELETED, obj("a", uid="u", rv="9"))
    first.extensions["leftselector"] = "true"
    second = event(EventType.DELETED, obj("a", uid="u", rv="15"))
    second.extensions["leftselector"] = "true"
    final = event(EventType.DELETED, obj("a", uid="u", rv="20"))
    assert len({event_id(first), event_id(second), event_id(final)}) == 3
    again = event(EventType.DELETED, obj("a", uid="u", rv="9"))
    again.extensions["leftselector"] = "true"
    assert event_id(again) == event_id(first)  # a redelivery keeps its id


def test_gap_markers_and_the_events_inside() -> None:
    gap = GapInfo(id="g-1", from_resource_version="100")
    begin = to_cloudevent(ChangeEvent(type=EventType.GAP_BEGIN, resource=NODES, cluster="prod", obj=None,
                                      time=T0, gap=gap))
    assert begin["type"] == "io.kube-event-bridge.gap.begin"
    assert (begin["gapid"], begin["gapfrom"]) == ("g-1", "100")
    assert not {"subject", "uid", "gapto"} & begin.keys()
    assert begin["data"] is None
    end_gap = GapInfo(id="g-1", from_resource_version="100", to_resource_version="130")
    end = to_cloudevent(ChangeEvent(type=EventType.GAP_END, resource=NODES, cluster="prod", obj=None,
                                    time=T0, gap=end_gap))
    assert (end["type"], end["gapid"], end["gapfrom"], end["gapto"]) == (
        "io.kube-event-bridge.gap.end", "g-1", "100", "130")
    other = to_cloudevent(ChangeEvent(type=EventType.GAP_BEGIN, resource=NODES, cluster="prod", obj=None,
                                      time=T0, gap=GapInfo(id="g-2", from_resource_version="100")))
    assert len({begin["id"], end["id"], other["id"]}) == 3
    inside = event(EventType.UPDATED, obj("a", uid="u", rv="120"), gap=gap)
    ce = to_cloudevent(inside)
    assert (ce["gapid"], ce["gapfrom"]) == ("g-1", "100")
    # The change's id does not depend on the gap: a redelivery in another gap deduplicates.
    assert ce["id"] == event_id(event(EventType.UPDATED, obj("a", uid="u", rv="120")))


_ids = st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(uid=_ids, rv=_ids, etype=st.sampled_from([t for t in EventType if t is not EventType.HEARTBEAT]),
       snap=st.none() | _ids, left=st.sampled_from([None, "true", "false"]))
def test_the_envelope_computes_the_same_id_as_event_id(uid: str, rv: str, etype: EventType, snap: str | None,
                                                       left: str | None) -> None:
    """The sinks' fast path has :func:`cloudevent_of` compute the id (``event_id_value`` None): it is
    :func:`event_id`'s, for every type, snapshot, selector exit and text (empty, non-ASCII)."""
    extensions = {} if left is None else {LEFT_SELECTOR: left}
    ev = ChangeEvent(type=etype, resource=DEPLOYMENTS, cluster="prod",
                     obj={"metadata": {"namespace": "ns", "name": "n", "uid": uid, "resourceVersion": rv}},
                     time=T0, snapshot=None if snap is None else SnapshotInfo(id=snap, resource_version="9"),
                     extensions=extensions)
    ce = cloudevent_of(ev, None, namespace="ns", name="n", uid=uid, resource_version=rv)
    assert ce["id"] == event_id(ev) == object_event_id(ev, uid, rv)
    assert ce == cloudevent_of(ev, event_id(ev), namespace="ns", name="n", uid=uid, resource_version=rv)
