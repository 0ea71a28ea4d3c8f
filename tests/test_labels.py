"""Label and field selector parsing and matching."""

from __future__ import annotations

import pytest

from bridge.kube.labels import SelectorError, parse_field_selector, parse_label_selector


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {"a": "1"}, True),
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("env in (prod, staging)", {"env": "staging"}, True),
        ("env in (prod,staging)", {"env": "dev"}, False),
        ("env notin (prod)", {}, True),
        ("env notin (prod)", {"env": "prod"}, False),
        ("tier", {"tier": ""}, True),
        ("!tier", {"tier": "x"}, False),
        ("app=web,env in (prod),!debug", {"app": "web", "env": "prod"}, True),
        ("app=web,env in (prod),!debug", {"app": "web", "env": "prod", "debug": "1"}, False),
        ("example.com/team=a", {"example.com/team": "a"}, True),
    ],
)
def test_label_selector_matches(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize("bad", ["app=(", "env in (a", "=x", "a=b=c d", "app=we b"])
def test_label_selector_rejects_garbage(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(bad)


def test_field_selector() -> None:
    obj = {"metadata": {"name": "web", "namespace": "prod"}, "spec": {"nodeName": "n1"}}
    assert parse_field_selector("metadata.name=web,metadata.namespace!=dev").matches_object(obj)
    assert not parse_field_selector("spec.nodeName==n2").matches_object(obj)
    assert parse_field_selector("").matches_object(obj)
    with pytest.raises(SelectorError):
        parse_field_selector("metadata.name")
