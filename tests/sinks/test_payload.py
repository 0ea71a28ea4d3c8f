"""Payload modes, and RFC 7386 merge patches (generation checked against application)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sinks.contract import EventType
from sinks.payload import PayloadMode, apply_merge_patch, build_payload, merge_patch


def test_rfc7386_examples_apply() -> None:
    # The examples of RFC 7386 appendix A (those without null values in the target).
    cases: list[tuple[Any, Any, Any]] = [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ]
    for target, patch, result in cases:
        assert apply_merge_patch(target, patch) == result


def test_merge_patch_generation() -> None:
    old = {
        "metadata": {"name": "a", "labels": {"app": "web", "tier": "fe"}, "resourceVersion": "1"},
        "spec": {"replicas": 1, "template": {"image": "x:1", "ports": [80]}},
        "status": {"ready": 1},
    }
    new = {
        "metadata": {"name": "a", "labels": {"app": "web", "canary": "true"}, "resourceVersion": "2"},
        "spec": {"replicas": 1, "template": {"image": "x:2", "ports": [80, 443]}},
    }
    assert merge_patch(old, new) == {
        "metadata": {"labels": {"tier": None, "canary": "true"}, "resourceVersion": "2"},
        "spec": {"template": {"image": "x:2", "ports": [80, 443]}},
        "status": None,
    }
    assert merge_patch(old, old) == {}
    assert apply_merge_patch(old, merge_patch(old, new)) == new


json_leaf = st.one_of(st.booleans(), st.integers(-5, 5), st.text(max_size=3))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=4)
    ),
    max_leaves=12,
)
json_object = st.dictionaries(st.text(max_size=2), json_value, max_size=5)


@given(json_object, json_object)
def test_merge_patch_round_trips(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert apply_merge_patch(old, merge_patch(old, new)) == new


def test_payload_modes() -> None:
    new, old = {"v": 2}, {"v": 1}
    assert build_payload(PayloadMode.OBJECT, EventType.UPDATED, new, old) == (new, "application/json")
    assert build_payload(PayloadMode.OBJECT_AND_OLD, EventType.UPDATED, new, old) == (
        {"object": new, "oldObject": old},
        "application/json",
    )
    assert build_payload(PayloadMode.OBJECT_AND_OLD, EventType.ADDED, new, None) == (
        {"object": new, "oldObject": None},
        "application/json",
    )
    assert build_payload(PayloadMode.MERGE_PATCH, EventType.UPDATED, new, old) == (
        {"v": 2},
        "application/merge-patch+json",
    )
    assert build_payload(PayloadMode.MERGE_PATCH, EventType.DELETED, new, None) == (new, "application/json")
    assert build_payload(PayloadMode.OBJECT, EventType.SNAPSHOT_BEGIN, None, None) == (
        None,
        "application/json",
    )
