"""The CEL ``filter`` and the ``fields`` projection of a sink (sinks/cel.py, docs/filters.md)."""

from __future__ import annotations

import copy
import logging
import random
from typing import Any

import orjson
import pytest
from cel_expr_python import cel as gcel

from bridge.rawobject import RawObject
from bridge.sim.objects import make_pod
from sinks.cel import (
    ERROR,
    FAIL,
    PASS,
    CelError,
    _Plan,
    _trie,
    compile_expression,
    prune,
    read_expression,
)
from sinks.contract import ChangeEvent, DeliveryOutcome, EventType, GapInfo, SinkConfigError, SnapshotInfo
from sinks.filters import parse_path
from tests.sinks import PODS, SECRETS, Acks, event, marker, obj
from tests.sinks.test_base_sink import make

SNAP = SnapshotInfo(id="s1", resource_version="10")


def pod(name: str, *, phase: str = "Running", image: str = "nginx:1", **labels: str) -> dict[str, Any]:
    p = make_pod(name, rng=random.Random(name))
    p["metadata"].update(uid=f"uid-{name}", resourceVersion="5")
    p["metadata"]["labels"].update(labels)
    p["status"]["phase"] = phase
    p["spec"]["containers"][0]["image"] = image
    return p


# ---- reading the expression ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "variables", "object_paths", "old_paths"),
    [
        ("type == 'added'", {"type"}, (), ()),
        ("has(object.status) && object.status.phase == 'Failed'", {"object"}, (("status",),), ()),
        ("object.?status.phase.orValue('') != oldObject.?status.phase.orValue('')",
         {"object", "oldObject"}, (("status", "phase"),), (("status", "phase"),)),
        ("object.metadata.labels['team'] == 'a' && object.metadata.labels[\"app\"] == 'b'", {"object"},
         (("metadata", "labels", "app"), ("metadata", "labels", "team")), ()),
        ("object.spec.containers.exists(c, c.image.startsWith('nginx'))", {"object"},
         (("spec", "containers", "*", "image"),), ()),
        ("object.metadata.name.startsWith('web') && object.metadata.name.size() > 3", {"object"},
         (("metadata", "name"),), ()),
        ("type(object) == map", {"object"}, None, ()),  # object passed whole; type() the function
        ("object.spec.type == 'x'", {"object"}, (("spec", "type"),), ()),  # a field named type
        ("'object.x' == namespace && manager == 'kubectl' && resource == 'pods'",
         {"namespace", "manager", "resource"}, (), ()),
    ],
)
def test_the_expression_is_read_for_its_variables_and_paths(
    source: str, variables: set[str], object_paths: Any, old_paths: Any
) -> None:
    reads, _ = read_expression(source)
    assert reads.variables == variables
    assert reads.object_paths == object_paths
    assert reads.old_paths == old_paths
    compile_expression(source)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("object.metadata.name ==", "1:24: Syntax error"),
        ("object.metadata.name.frobnicate() == 'x'", "undeclared reference to 'frobnicate'"),
        ("type == 1", "1:6: found no matching overload for '_==_' applied to '(string, int)'"),
        ("namespace + 1 == 2", "found no matching overload for '_+_'"),
        ("namespace", "must be a condition (bool), not string"),
        ("", "empty expression"),
    ],
)
def test_a_bad_expression_is_refused_with_cels_message_and_position(source: str, expected: str) -> None:
    with pytest.raises(CelError) as info:
        compile_expression(source)
    assert expected in str(info.value)
    if "ERROR:" in str(info.value):
        assert f"| {source}" in str(info.value)  # quoted as written (type is renamed inside)


def test_a_bad_filter_names_the_sink_and_the_field() -> None:
    with pytest.raises(SinkConfigError) as info:
        make(filter="type == 1")
    text = str(info.value)
    assert text.startswith("sink 'rec': filter: ERROR: <input>:1:6: found no matching overload")
    with pytest.raises(SinkConfigError, match="filter: Input should be a valid string"):
        make(filter=3)
    with pytest.raises(SinkConfigError, match="filter_errors: Input should be 'keep' or 'drop'"):
        make(filter="true", filter_errors="maybe")
    with pytest.raises(SinkConfigError, match="fields"):
        make(fields=["spec..x"])


# ---- pruning evaluates as the whole object --------------------------------------------------------

EXAMPLES = [
    "object.status.phase == 'Failed'",
    "has(object.status.reason) && object.status.reason == 'Evicted'",
    "object.spec.containers.exists(c, c.image.startsWith('nginx'))",
    "object.metadata.labels['team'] == 'payments'",
    "object.metadata.?labels.team.orValue('') == 'payments'",
    "object.metadata.ownerReferences.exists(o, o.kind == 'ReplicaSet')",
    "timestamp(object.status.startTime) < timestamp('2100-01-01T00:00:00Z')",
    "object.metadata.nosuch == 'x'",
    "object.spec.containers[0].image.endsWith(':1')",
    "size(object.metadata.annotations) > 0 && object.status.phase != oldObject.status.phase",
    "object.spec.containers.map(c, c.image) != oldObject.spec.containers.map(c, c.image)",
    "object.spec.containers.exists(c, has(c.ports) && c.ports.exists(p, p.containerPort == 8080))",
    "oldObject != null && object.metadata.ownerReferences.all(o, o.controller)",
]


@pytest.mark.parametrize("source", EXAMPLES)
@pytest.mark.parametrize("raw", [False, True], ids=["dict", "raw"])
def test_a_pruned_object_evaluates_as_the_whole_one(source: str, raw: bool) -> None:
    program = compile_expression(source).program
    whole = make(filter=source)
    flt = whole._filter
    assert flt is not None
    for name, team, phase in [("a", "payments", "Failed"), ("b", "web", "Running"), ("c", "", "Pending")]:
        new = pod(name, phase=phase, team=team) if team else pod(name, phase=phase)
        old = pod(name, phase="Running")
        if name == "c":
            del new["metadata"]["labels"]
            new["status"].pop("startTime", None)
        shown: Any = RawObject.from_dict(new) if raw else new
        before: Any = RawObject.from_dict(old) if raw else old
        ev = event(EventType.UPDATED, shown, old=before)
        expected = program.eval(data={"object": copy.deepcopy(new), "oldObject": copy.deepcopy(old)})
        verdict = flt.decide(ev)
        if expected.type() == gcel.Type.BOOL:
            assert verdict == (PASS if expected.value() else FAIL), (name, source)
        else:
            assert verdict == ERROR, (name, source, flt.last_error)


def test_prune_keeps_only_the_paths_and_reads_wildcards() -> None:
    p = pod("a")
    out = prune(p, [parse_path("metadata.name"), parse_path("spec.containers.*.image"), parse_path("nope.x")])
    assert out == {"metadata": {"name": "a"},
                   "spec": {"containers": [{"image": c["image"]} for c in p["spec"]["containers"]]}}


# ---- in a sink ------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True], ids=["deliver", "deliver_batch"])
async def test_only_matching_events_go_and_markers_pass(batch: bool) -> None:
    sink = make(filter="object.status.phase == 'Failed'")
    await sink.start()
    acks = Acks()
    events = [
        ("begin", marker(EventType.SNAPSHOT_BEGIN, SNAP)),
        ("a", event(EventType.ADDED, pod("a"))),
        ("b", event(EventType.UPDATED, pod("b", phase="Failed"), old=pod("b"))),
        ("end", marker(EventType.SNAPSHOT_END, SNAP)),
        ("c", event(EventType.DELETED, pod("c", phase="Failed"))),
    ]
    if batch:
        await sink.deliver_batch([e for _, e in events], [acks.cb(label) for label, _ in events])
    else:
        for label, e in events:
            await sink.deliver(e, acks.cb(label))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.FILTERED) == ["a"]
    assert [m.event.type.value for m in sink.sent] == ["snapshot.begin", "updated", "snapshot.end", "deleted"]
    assert sink.stats.filtered == 1
    assert sink.stats.filter_errors == 0
    await sink.close()


async def test_an_expression_naming_type_sees_the_markers() -> None:
    sink = make(filter="type != 'snapshot.begin' && type != 'snapshot.end'")
    await sink.start()
    acks = Acks()
    await sink.deliver(marker(EventType.SNAPSHOT_BEGIN, SNAP), acks.cb("begin"))
    await sink.deliver(event(EventType.ADDED, pod("a")), acks.cb("a"))
    await sink.deliver(marker(EventType.SNAPSHOT_END, SNAP), acks.cb("end"))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.FILTERED) == ["begin", "end"]
    assert acks.of(DeliveryOutcome.DELIVERED) == ["a"]
    await sink.close()


async def test_variables_type_resource_namespace_manager_and_old_object() -> None:
    managed = [{"manager": "kubectl-edit", "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {}}]
    sink = make(filter="type == 'updated' && resource == 'pods' && namespace == 'default' "
                       "&& manager == 'kubectl-edit' && oldObject.status.phase == 'Running'")
    await sink.start()
    acks = Acks()
    one = pod("a", phase="Failed")
    one["metadata"]["managedFields"] = managed
    two = copy.deepcopy(one)
    two["metadata"]["managedFields"] = [dict(managed[0], manager="kubelet")]
    await sink.deliver(event(EventType.UPDATED, one, old=pod("a")), acks.cb("edit"))
    await sink.deliver(event(EventType.UPDATED, two, old=pod("a")), acks.cb("kubelet"))
    # oldObject is null for an added event: 'type' being false first, && never reads it
    await sink.deliver(event(EventType.ADDED, one), acks.cb("added"))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.DELIVERED) == ["edit"]
    assert acks.of(DeliveryOutcome.FILTERED) == ["kubelet", "added"]
    assert sink.stats.filter_errors == 0
    await sink.close()


@pytest.mark.parametrize(("mode", "delivered"), [("keep", ["with", "without"]), ("drop", ["with"])])
async def test_an_evaluation_error_is_counted_logged_once_and_kept_or_dropped(
    mode: str, delivered: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    source = f"object.status.reason == 'Evicted' && '{mode}' != ''"
    sink = make(filter=source, filter_errors=mode)
    await sink.start()
    acks = Acks()
    evicted = pod("with")
    evicted["status"]["reason"] = "Evicted"
    with caplog.at_level(logging.WARNING, logger="sinks.base"):
        await sink.deliver(event(EventType.ADDED, evicted), acks.cb("with"))
        await sink.deliver(event(EventType.ADDED, pod("without")), acks.cb("without"))
        await sink.deliver(event(EventType.ADDED, pod("without-too")), acks.cb("other"))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.DELIVERED) == [*delivered, *(["other"] if mode == "keep" else [])]
    assert sink.stats.filter_errors == 2
    failures = [r for r in caplog.records if "filter" in r.getMessage()]
    assert len(failures) == 1
    assert "pods default/without" in failures[0].getMessage()
    assert "Key not found in map" in failures[0].getMessage()
    await sink.close()


async def test_sinks_with_one_expression_share_its_evaluation() -> None:
    one = make(filter="object.metadata.name == 'a'")
    two = make(filter="object.metadata.name == 'a'")
    other_redaction = make(filter="object.metadata.name == 'a'", redact={"paths": ["metadata.name"]})
    assert one._filter is two._filter
    assert other_redaction._filter is not one._filter
    assert make()._filter is None
    ev = event(EventType.ADDED, pod("a"))
    shared = one._filter
    assert shared is not None

    class Counting:
        calls = 0

        def __init__(self, program: Any) -> None:
            self.program = program

        def eval(self, **kw: Any) -> Any:
            Counting.calls += 1
            return self.program.eval(**kw)

    shared._program = Counting(shared._program)
    for sink in (one, two):
        await sink.start()
        await sink.deliver(ev, Acks().cb("a"))
        assert await sink.flush(5)
        assert len(sink.sent) == 1
        await sink.close()
    assert Counting.calls == 1


async def test_the_filter_reads_the_object_as_sent_after_redaction() -> None:
    secret = obj("s", kind="Secret", data={"password": "aHVudGVyMg=="})
    sink = make(filter="object.data.password == '<redacted>'")
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, secret, resource=SECRETS), acks.cb("s"))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.DELIVERED) == ["s"]
    await sink.close()


# ---- fields ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [False, True], ids=["dict", "raw"])
@pytest.mark.parametrize("batch", [False, True], ids=["deliver", "deliver_batch"])
async def test_fields_send_only_those_paths_and_say_so(raw: bool, batch: bool) -> None:
    fields = ["metadata.name", "status.phase", "spec.containers.*.image"]
    sink = make(fields=fields, destination="team-{labels[team]}")
    await sink.start()
    p = pod("a", team="payments")
    o: Any = RawObject.from_dict(p) if raw else p
    events = [event(EventType.ADDED, o), marker(EventType.SNAPSHOT_BEGIN, SNAP)]
    acks = Acks()
    if batch:
        await sink.deliver_batch(events, [acks.cb("a"), acks.cb("m")])
    else:
        for e, label in zip(events, "am", strict=True):
            await sink.deliver(e, acks.cb(label))
    assert await sink.flush(5)
    first, mark = sink.sent
    ce = orjson.loads(first.body)
    assert ce["data"] == {"metadata": {"name": "a"}, "status": {"phase": "Running"},
                          "spec": {"containers": [{"image": "nginx:1"}]}}
    assert ce["fields"] == "metadata.name,status.phase,spec.containers.*.image"
    # the envelope's attributes stay whole
    assert (ce["subject"], ce["uid"], ce["resourceversion"], ce["namespace"]) == ("default/a", "uid-a", "5",
                                                                                  "default")
    assert first.destination == "team-payments"
    assert len(first.body) < len(orjson.dumps(p)) / 3
    assert "fields" not in orjson.loads(mark.body)
    await sink.close()


async def test_fields_apply_after_redaction_and_to_the_old_object() -> None:
    secret = obj("s", kind="Secret", data={"password": "aHVudGVyMg=="}, type="Opaque")
    old = obj("s", kind="Secret", data={"password": "b2xk"}, type="Opaque")
    sink = make(fields=["data", "type"], payload="object_and_old")
    await sink.start()
    await sink.deliver(event(EventType.UPDATED, secret, old=old, resource=SECRETS), Acks().cb("s"))
    assert await sink.flush(5)
    data = orjson.loads(sink.sent[0].body)["data"]
    assert data["object"] == {"data": {"password": "<redacted>"}, "type": "Opaque"}
    assert data["oldObject"] == {"data": {"password": "<redacted>"}, "type": "Opaque"}
    await sink.close()


def test_a_comprehension_reads_only_what_its_variable_selects_below_each_item() -> None:
    reads, _ = read_expression("object.spec.containers.map(c, c.image) != "
                               "oldObject.spec.containers.map(c, c.image)")
    assert reads.object_paths == reads.old_paths == (("spec", "containers", "*", "image"),)
    reads, _ = read_expression("object.metadata.ownerReferences.exists(o, o.kind == 'Job' && "
                               "has(o.controller))")
    assert reads.object_paths == (("metadata", "ownerReferences", "*", "controller"),
                                  ("metadata", "ownerReferences", "*", "kind"))
    # the variable used whole, or the two-variable form: the whole range
    whole = (("spec", "containers"),)
    assert read_expression("object.spec.containers.exists(c, c == {})")[0].object_paths == whole
    assert read_expression("object.spec.containers.all(i, c, c.x)")[0].object_paths == whole
    # presence only
    assert read_expression("oldObject == null || oldObject.status.phase != 'x'")[0].old_paths == (
        ("status", "phase"),)
    assert read_expression("'a' in oldObject == null")[0].old_paths is None


def test_prune_merges_a_named_key_with_a_wildcard() -> None:
    tree = {"a": {"x": {"p": 1, "q": 2, "r": 3}, "y": {"p": 4, "q": 5}}}
    assert prune(tree, [("a", "*", "p"), ("a", "x", "q")]) == {"a": {"x": {"p": 1, "q": 2}, "y": {"p": 4}}}


@pytest.mark.parametrize("paths", [
    [("status", "phase")],
    [("metadata", "labels", "team"), ("spec", "containers", "*", "image")],
    [("spec", "containers", "*", "ports", "*", "containerPort")],
    [("metadata", "labels", "*")],  # every key of a mapping
    [("nope", "x")],  # absent
    [("metadata", "name", "x")],  # a string where an object is expected
    [("spec", "containers", "x")],  # a list where an object is expected
    [("status", "nothing", "x"), ("status", "nothing")],  # null
])
def test_decoding_only_what_is_read_gives_the_pruned_object(paths: list[tuple[str, ...]]) -> None:
    p = pod("a")
    p["status"]["nothing"] = None
    assert _Plan(_trie(paths)).decode(orjson.dumps(p)) == prune(p, paths)


async def test_gap_markers_pass_a_filter_not_naming_type_and_meet_one_that_does() -> None:
    gap = GapInfo(id="g1", from_resource_version="7")
    begin = ChangeEvent(type=EventType.GAP_BEGIN, resource=PODS, cluster="prod", obj=None, gap=gap)
    end = ChangeEvent(type=EventType.GAP_END, resource=PODS, cluster="prod", obj=None,
                      gap=GapInfo(id="g1", from_resource_version="7", to_resource_version="9"))
    plain_filter = make(filter="object.status.phase == 'Failed'")
    by_type = make(filter="type != 'gap.begin'")
    for sink, delivered in ((plain_filter, ["begin", "end"]), (by_type, ["end"])):
        await sink.start()
        acks = Acks()
        await sink.deliver_batch([begin, end], [acks.cb("begin"), acks.cb("end")])
        assert await sink.flush(5)
        assert acks.of(DeliveryOutcome.DELIVERED) == delivered
        assert sink.stats.filter_errors == 0
        await sink.close()


async def test_manager_is_read_from_an_object_kept_as_bytes() -> None:
    p = pod("a")
    p["metadata"]["managedFields"] = [{"manager": "helm", "operation": "Update", "apiVersion": "v1",
                                       "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                                       "fieldsV1": {}}]
    raw = RawObject.from_dict(p).without_managed_fields()
    assert not raw.managed_fields
    sink = make(filter="manager == 'helm'")
    await sink.start()
    acks = Acks()
    shown: Any = raw
    await sink.deliver(event(EventType.UPDATED, shown, old=pod("a", phase="Pending")), acks.cb("helm"))
    await sink.deliver(event(EventType.UPDATED, pod("b"), old=pod("b", phase="Pending")), acks.cb("other"))
    assert await sink.flush(5)
    assert acks.of(DeliveryOutcome.DELIVERED) == ["helm"]
    assert acks.of(DeliveryOutcome.FILTERED) == ["other"]  # its manager: the simulator's own
    await sink.close()
