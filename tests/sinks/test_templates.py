"""Destination templates: fields, label lookups, sanitising, and errors at construction."""

from __future__ import annotations

import pytest

from sinks.contract import EventType
from sinks.templates import (
    Template,
    TemplateError,
    sanitize_kafka_topic,
    sanitize_nats_token,
    sanitize_url_segment,
)
from tests.sinks import DEPLOYMENTS, NODES, event, obj


def test_every_field_renders() -> None:
    ev = event(
        EventType.ADDED,
        obj("api", namespace="shop", uid="u-9", labels={"app": "checkout"}),
        resource=DEPLOYMENTS,
    )
    t = Template("{cluster}/{group}/{version}/{resource}/{kind}/{namespace}/{name}/{uid}/{labels[app]}")
    assert t.render(ev) == "prod/apps/v1/deployments/Deployment/shop/api/u-9/checkout"
    assert t.fields == (
        "cluster",
        "group",
        "version",
        "resource",
        "kind",
        "namespace",
        "name",
        "uid",
        "labels",
    )


def test_missing_values_render_empty_and_static_text_is_kept() -> None:
    ev = event(EventType.ADDED, obj("n1", namespace=None), resource=NODES)
    assert Template("k8s.{namespace}.{labels[team]}.{name}").render(ev) == "k8s...n1"
    assert Template("fixed-topic").render(ev) == "fixed-topic"
    assert Template("{{literal}}-{name}").render(ev) == "{literal}-n1"


def test_sanitisers_apply_to_values_not_to_literal_text() -> None:
    ev = event(EventType.ADDED, obj("web.1*>x", namespace="a b", labels={"app": "x/y"}))
    assert Template("k8s.{namespace}.{name}").render(ev, sanitize_nats_token) == "k8s.a_b.web_1__x"
    assert Template("k8s.{name}.{labels[app]}").render(ev, sanitize_kafka_topic) == "k8s.web.1__x.x_y"
    assert (
        Template("/hooks/{labels[app]}/{name}").render(ev, sanitize_url_segment)
        == "/hooks/x%2Fy/web.1%2A%3Ex"
    )
    assert sanitize_nats_token("") == "_"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k8s.{foo}", "unknown template field 'foo'"),
        ("{Namespace}", "unknown template field 'Namespace'"),
        ("{labels}", "needs a label key"),
        ("{name[x]}", "takes no [key]"),
        ("{name!r}", "no format spec or conversion"),
        ("{name:>10}", "no format spec or conversion"),
        ("{name", "malformed template"),
        ("name}", "malformed template"),
    ],
)
def test_errors(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Template(text)
