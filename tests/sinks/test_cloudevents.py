"""The CloudEvents envelope: every attribute, both content modes, Knative compatibility, ids."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from sinks.cloudevents import (
    decode_binary,
    decode_structured,
    encode_binary,
    encode_structured,
    event_id,
    rfc3339,
    to_cloudevent,
)
from sinks.contract import ChangeEvent, EventType, GapInfo, SnapshotInfo
from tests.sinks import DEPLOYMENTS, NODES, T0, event, marker, obj


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
    node = to_cloudevent(event(EventType.ADDED, obj("n1", namespace=None), resource=NODES), compat="knative")
    assert node["subject"] == "/apis/v1/nodes/n1"
    m = to_cloudevent(
        marker(EventType.SNAPSHOT_BEGIN, SnapshotInfo(id="s", resource_version="1")), compat="knative"
    )
    assert m["type"] == "io.kube-event-bridge.snapshot.begin"
    assert m["source"] == "/clusters/prod/api/v1/pods"


def test_extensions_are_sanitised_and_never_override() -> None:
    ce = to_cloudevent(event(extensions={"Trace-Parent": "00-abc", "id": "nope", "__": "x"}))
    assert ce["traceparent"] == "00-abc"
    assert ce["id"] != "nope"
    assert "" not in ce


def test_structured_round_trip() -> None:
    ce = to_cloudevent(event(EventType.ADDED, obj("a")))
    body = encode_structured(ce)
    assert decode_structured(body) == orjson.loads(orjson.dumps(ce))


@pytest.mark.parametrize("prefix", ["ce-", "ce_"])
def test_binary_round_trip_with_prefix_and_percent_encoding(prefix: str) -> None:
    o = obj("café", namespace="ns")
    ce = to_cloudevent(event(EventType.UPDATED, o, extensions={"note": 'a "quoted" 100%'}))
    headers, body = encode_binary(ce, prefix)
    assert headers["content-type"] == "application/json"
    assert headers[f"{prefix}subject"] == "ns/caf%C3%A9"
    assert headers[f"{prefix}note"] == "a %22quoted%22 100%25"
    assert all(v.isascii() for v in headers.values())
    assert orjson.loads(body) == o
    back = decode_binary({k.upper(): v for k, v in headers.items()}, body, prefix)
    assert back == ce


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
