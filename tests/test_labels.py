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


_QNAME_RULE = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
               "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
               "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("x>1", {"x": "2"}, True),
        ("x>1", {"x": "1"}, False),
        ("x<1", {"x": "-5"}, True),
        ("x<1", {"x": "a"}, False),
        ("x<1", {}, False),
        ("x > 10,y", {"x": "11", "y": ""}, True),
        # As apimachinery: "()" is the set of the empty value, "x=" the empty value.
        ("tier in ()", {"tier": ""}, True),
        ("tier in ()", {"tier": "web"}, False),
        ("tier notin ()", {"tier": "web"}, True),
        ("tier=", {"tier": ""}, True),
        ("x in (a,,b)", {"x": ""}, True),
        ("value in (in, notin)", {"value": "notin"}, True),
        ("a.b-c/d_e.f=x", {"a.b-c/d_e.f": "x"}, True),
    ],
)
def test_label_selector_grammar_of_apimachinery(
    selector: str, labels: dict[str, str], expected: bool,
) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        # The messages the API server answers (apimachinery's parser and validation, verbatim).
        ("k" * 64, f'unable to parse requirement: <nil>: Invalid value: "{"k" * 64}": name part must be no '
                   "more than 63 characters"),
        ("app:web",
         f'unable to parse requirement: <nil>: Invalid value: "app:web": name part {_QNAME_RULE}'),
        ("x>a", "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, "
                "the value must be an integer"),
        ("x>", "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, "
               "the value must be an integer"),
        ("x=a*b",
         'unable to parse requirement: values[0][x]: Invalid value: "a*b": a valid label must be an empty '
         "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
         "alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation "
         "is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
        ("x=" + "v" * 64,
         f'unable to parse requirement: values[0][x]: Invalid value: "{"v" * 64}": must be no more than 63 '
         "characters"),
        ("Bad_Prefix/x",
         'unable to parse requirement: <nil>: Invalid value: "Bad_Prefix/x": prefix part a lowercase RFC '
         "1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and "
         "end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
         "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*"
                         "[a-z0-9])?)*')"),
        ("env in (a", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("app=web env=prod", "found 'env', expected: ',' or 'end of string'"),
        ("app=web,", "found '', expected: identifier after ','"),
        ("=x", "found '=', expected: !, identifier, or 'end of string'"),
        ("x y", "unable to parse requirement: found 'y', expected: in, notin, =, ==, !=, gt, lt"),
        ("x in y", "unable to parse requirement: found 'y' expected: '('"),
        ("!x=a", "found '=', expected: ',' or 'end of string'"),
        ("x=(", "unable to parse requirement: found '(', expected: identifier"),
    ],
)
def test_label_selector_errors_are_the_api_servers(bad: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector(bad)
    assert str(info.value) == message


def test_field_selector_grammar_and_supported_labels() -> None:
    from bridge.kube.labels import check_field_selector_fields

    sel = parse_field_selector(r"metadata.name=a\,b,status.phase!=Running")
    assert sel.requirements == (("metadata.name", True, "a,b"), ("status.phase", False, "Running"))
    check_field_selector_fields(sel, group="", resource="pods")
    with pytest.raises(SelectorError) as info:
        check_field_selector_fields(parse_field_selector("spec.nodname=n1"), group="", resource="pods")
    assert str(info.value) == "field label not supported: spec.nodname"
    with pytest.raises(SelectorError) as info:
        check_field_selector_fields(parse_field_selector("spec.replicas=1"), group="apps",
                                    resource="deployments")
    assert str(info.value) == '"spec.replicas" is not a known field selector: only "metadata.name", ' \
                              '"metadata.namespace"'
    # A custom resource's selectable fields are the server's to say.
    check_field_selector_fields(parse_field_selector("spec.color=red"), group="example.com",
                                resource="widgets")
    with pytest.raises(SelectorError) as info:
        parse_field_selector("metadata.name")
    assert str(info.value) == "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
    with pytest.raises(SelectorError) as info:
        parse_field_selector("metadata.name=a=b")
    assert str(info.value) == "invalid field selector: unescaped character in value: ="
