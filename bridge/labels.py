"""Label and field selectors, parsed, validated and matched as the API server does.

Used by the listers (local queries over the cache), the simulator (server-side filtering), the
per-sink routing filters and ``check-config``: the project's one implementation. A leaf module in the
foundations (it imports nothing from the rest of the package), so that the sinks, which may depend on
nothing but the foundations and their contract, match labels exactly as the API server does too;
``bridge.kube.labels`` re-exports it.

Label selectors follow ``k8s.io/apimachinery/pkg/labels`` (``selector.go``): the same lexer (tokens
split at whitespace and at ``= ! ( ) , > <``), the same recursive-descent parser, the same
validation of keys (a qualified name: an optional DNS-subdomain prefix and ``/``, then a name of at
most 63 characters) and values (at most 63 characters), and the same error messages, so that a
selector the bridge rejects is one the API server would reject, with the text the server would
answer::

    selector    := requirement ("," requirement)*
    requirement := ["!"] key
                 | key ("=" | "==" | "!=") [value]
                 | key (">" | "<") integer
                 | key ("in" | "notin") "(" [value ("," [value])*] ")"

As in apimachinery, an empty value is a value: ``tier in ()`` is ``tier in ("")`` (it matches only
objects whose ``tier`` label is the empty string) and ``tier=`` is ``tier=""``.

Field selectors follow ``k8s.io/apimachinery/pkg/fields``: terms split at unescaped commas, each
``field=value``, ``field==value`` or ``field!=value`` split at the first operator, values unescaped
(``\\,`` ``\\=`` ``\\\\``). Which fields a resource supports is the API server's business: for the
built-in resources :func:`check_field_selector_fields` knows the answer and gives the server's
message for the others.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "Operator",
    "Requirement",
    "SelectorError",
    "check_field_selector_fields",
    "parse_field_selector",
    "parse_label_selector",
    "supported_field_labels",
]


class SelectorError(ValueError):
    """A selector string the API server would refuse; the message is the server's."""


class Operator(enum.Enum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


# --------------------------------------------------------------------------------------------------
# validation (k8s.io/apimachinery/pkg/util/validation), with the server's messages

_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QNAME_RE = re.compile(rf"^{_QNAME_FMT}$")
_QNAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
              "alphanumeric character")
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_SUBDOMAIN_FMT}$")
_DNS1123_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                          "characters, '-' or '.', and must start and end with an alphanumeric character")
_LABEL_VALUE_FMT = f"({_QNAME_FMT})?"
_LABEL_VALUE_RE = re.compile(rf"^{_LABEL_VALUE_FMT}$")
_LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
                    "or '.', and must start and end with an alphanumeric character")
_INT64_RE = re.compile(r"^[+-]?[0-9]+$")


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    quoted = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {quoted}regex used for validation is '{fmt}')"


def _max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def _is_dns1123_subdomain(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > 253:
        errs.append(_max_len_error(253))
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        errs.append(_regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def _is_qualified_name(value: str) -> list[str]:
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in _is_dns1123_subdomain(prefix))
    else:
        return ["a qualified name " + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len_error(63))
    if not _QNAME_RE.match(name):
        errs.append("name part " + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def _is_label_value(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > 63:
        errs.append(_max_len_error(63))
    if not _LABEL_VALUE_RE.match(value):
        errs.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def _go_quote(value: str) -> str:
    """A string as Go's ``%q`` prints it (for the ASCII the messages meet, JSON's quoting is Go's)."""
    return json.dumps(value, ensure_ascii=False)


def _invalid(path: str, value: str, detail: str) -> str:
    """``field.Invalid(path, value, detail).Error()``."""
    return f"{path}: Invalid value: {_go_quote(value)}: {detail}"


def _aggregate(errors: list[str]) -> str:
    """``utilerrors.NewAggregate(errors).Error()``: one message, or several (deduplicated) in brackets."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def _int64(text: str) -> int | None:
    if not _INT64_RE.match(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


# --------------------------------------------------------------------------------------------------
# label selectors


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        match self.operator:
            case Operator.EXISTS:
                return present
            case Operator.DOES_NOT_EXIST:
                return not present
            case Operator.EQUALS | Operator.IN:
                return present and labels[self.key] in self.values
            case Operator.NOT_EQUALS | Operator.NOT_IN:
                return not present or labels[self.key] not in self.values
            case Operator.GREATER_THAN | Operator.LESS_THAN:
                if not present or len(self.values) != 1:
                    return False
                have, want = _int64(labels[self.key]), _int64(next(iter(self.values)))
                if have is None or want is None:
                    return False
                return have > want if self.operator is Operator.GREATER_THAN else have < want
        raise AssertionError(self.operator)  # pragma: no cover


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()
    text: str = ""

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def matches_object(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return self.matches(meta.get("labels") or {})

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return self.text


class _Tok(enum.Enum):
    ERROR = enum.auto()
    END = enum.auto()
    CLOSE_PAR = enum.auto()
    COMMA = enum.auto()
    NOT = enum.auto()
    DOUBLE_EQUALS = enum.auto()
    EQUALS = enum.auto()
    GREATER = enum.auto()
    IDENT = enum.auto()
    IN = enum.auto()
    LESS = enum.auto()
    NOT_EQUALS = enum.auto()
    NOT_IN = enum.auto()
    OPEN_PAR = enum.auto()


_TOKENS = {
    ")": _Tok.CLOSE_PAR, ",": _Tok.COMMA, "!": _Tok.NOT, "==": _Tok.DOUBLE_EQUALS, "=": _Tok.EQUALS,
    ">": _Tok.GREATER, "in": _Tok.IN, "<": _Tok.LESS, "!=": _Tok.NOT_EQUALS, "notin": _Tok.NOT_IN,
    "(": _Tok.OPEN_PAR,
}
_WHITESPACE = frozenset(" \t\r\n")
_SPECIAL = frozenset("=!(),><")
_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"


def _lex(text: str) -> list[tuple[_Tok, str]]:
    """apimachinery's Lexer, run to the end (``scan``)."""
    items: list[tuple[_Tok, str]] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= n:
            items.append((_Tok.END, ""))
            return items
        if text[pos] in _SPECIAL:
            # The longest run of special symbols that is a token.
            buffer = ""
            last: tuple[_Tok, str] | None = None
            while pos < n and text[pos] in _SPECIAL:
                buffer += text[pos]
                tok = _TOKENS.get(buffer)
                if tok is not None:
                    last = (tok, buffer)
                elif last is not None:
                    break
                pos += 1
            error = (_Tok.ERROR, f"error expected: keyword found '{buffer}'")
            items.append(last if last is not None else error)
        else:
            start = pos
            while pos < n and text[pos] not in _SPECIAL and text[pos] not in _WHITESPACE:
                pos += 1
            word = text[start:pos]
            items.append((_TOKENS.get(word, _Tok.IDENT), word))


class _Parser:
    """apimachinery's label selector Parser. In the *values* context the keywords ``in`` and
    ``notin`` are identifiers (``x in (in)`` is valid)."""

    def __init__(self, text: str) -> None:
        self._items = _lex(text)
        self._pos = 0

    def _peek(self, values: bool = True) -> tuple[_Tok, str]:
        tok, lit = self._items[self._pos]
        if values and tok in (_Tok.IN, _Tok.NOT_IN):
            tok = _Tok.IDENT
        return tok, lit

    def _next(self, values: bool = True) -> tuple[_Tok, str]:
        item = self._peek(values)
        self._pos += 1
        return item

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            tok, lit = self._peek()
            if tok in (_Tok.IDENT, _Tok.NOT):
                try:
                    requirements.append(self._requirement())
                except SelectorError as e:
                    raise SelectorError(f"unable to parse requirement: {e}") from None
                t, lit2 = self._next()
                if t is _Tok.END:
                    return requirements
                if t is _Tok.COMMA:
                    t2, lit3 = self._peek()
                    if t2 not in (_Tok.IDENT, _Tok.NOT):
                        raise SelectorError(f"found '{lit3}', expected: identifier after ','")
                else:
                    raise SelectorError(f"found '{lit2}', expected: ',' or 'end of string'")
            elif tok is _Tok.END:
                return requirements
            else:
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def _requirement(self) -> Requirement:
        key, operator = self._key_and_inferred_operator()
        if operator is not None:
            return _new_requirement(key, operator, [])
        operator = self._operator()
        values = self._values() if operator in (Operator.IN, Operator.NOT_IN) else self._exact_value()
        return _new_requirement(key, operator, sorted(values))

    def _key_and_inferred_operator(self) -> tuple[str, Operator | None]:
        operator: Operator | None = None
        tok, lit = self._next()
        if tok is _Tok.NOT:
            operator = Operator.DOES_NOT_EXIST
            tok, lit = self._next()
        if tok is not _Tok.IDENT:
            raise SelectorError(f"found '{lit}', expected: identifier")
        errs = _is_qualified_name(lit)
        if errs:
            raise SelectorError(_invalid("<nil>", lit, "; ".join(errs)))
        if self._peek()[0] in (_Tok.END, _Tok.COMMA) and operator is None:
            operator = Operator.EXISTS
        return lit, operator

    def _operator(self) -> Operator:
        tok, lit = self._next(values=False)
        ops = {
            _Tok.IN: Operator.IN, _Tok.EQUALS: Operator.EQUALS, _Tok.DOUBLE_EQUALS: Operator.EQUALS,
            _Tok.GREATER: Operator.GREATER_THAN, _Tok.LESS: Operator.LESS_THAN, _Tok.NOT_IN: Operator.NOT_IN,
            _Tok.NOT_EQUALS: Operator.NOT_EQUALS,
        }
        op = ops.get(tok)
        if op is None:
            raise SelectorError(f"found '{lit}', expected: {_BINARY_OPERATORS}")
        return op

    def _values(self) -> set[str]:
        tok, lit = self._next()
        if tok is not _Tok.OPEN_PAR:
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self._peek()
        if tok in (_Tok.IDENT, _Tok.COMMA):
            values = self._identifiers()
            if self._next()[0] is not _Tok.CLOSE_PAR:
                raise SelectorError(f"found '{lit}', expected: ')'")
            return values
        if tok is _Tok.CLOSE_PAR:  # "()" is the set of the empty value
            self._next()
            return {""}
        raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")

    def _identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            tok, lit = self._next()
            if tok is _Tok.IDENT:
                values.add(lit)
                tok2, lit2 = self._peek()
                if tok2 is _Tok.COMMA:
                    continue
                if tok2 is _Tok.CLOSE_PAR:
                    return values
                raise SelectorError(f"found '{lit2}', expected: ',' or ')'")
            if tok is _Tok.COMMA:  # "(," ",," ",)" each stand for an empty value
                if not values:
                    values.add("")
                tok2 = self._peek()[0]
                if tok2 is _Tok.CLOSE_PAR:
                    values.add("")
                    return values
                if tok2 is _Tok.COMMA:
                    values.add("")
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def _exact_value(self) -> set[str]:
        tok, _ = self._peek()
        if tok in (_Tok.END, _Tok.COMMA):
            return {""}
        tok, lit = self._next()
        if tok is _Tok.IDENT:
            return {lit}
        raise SelectorError(f"found '{lit}', expected: identifier")


def _new_requirement(key: str, operator: Operator, values: list[str]) -> Requirement:
    """apimachinery's ``NewRequirement`` validation (the key was checked by the parser)."""
    errors: list[str] = []
    if operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        for i, v in enumerate(values):  # the parser gives these operators exactly one value
            if _int64(v) is None:
                errors.append(_invalid(f"values[{i}]", v, "for 'Gt', 'Lt' operators, the value must be an "
                                                         "integer"))
    for i, v in enumerate(values):
        errs = _is_label_value(v)
        if errs:
            errors.append(_invalid(f"values[{i}][{key}]", v, "; ".join(errs)))
    if errors:
        raise SelectorError(_aggregate(errors))
    return Requirement(key, operator, frozenset(values))


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parses a label selector as the API server does; ``""``/None (or blanks) match everything.
    Raises :class:`SelectorError` with the server's message."""
    text = text or ""
    reqs = _Parser(text).parse()
    reqs.sort(key=lambda r: r.key)
    return LabelSelector(tuple(reqs), text.strip())


# --------------------------------------------------------------------------------------------------
# field selectors


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """Equality requirements over dotted field paths (``metadata.name=web``)."""

    requirements: tuple[tuple[str, bool, str], ...] = ()
    """(path, must_equal, value)"""
    text: str = ""

    def matches_object(self, obj: Mapping[str, Any]) -> bool:
        for path, must_equal, value in self.requirements:
            actual = _lookup(obj, path)
            if (actual == value) != must_equal:
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.requirements

    @property
    def fields(self) -> tuple[str, ...]:
        """The field paths the selector names, in order."""
        return tuple(r[0] for r in self.requirements)

    def __str__(self) -> str:
        return self.text


def _lookup(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    start = 0
    in_slash = False
    for i, c in enumerate(text):
        if in_slash:
            in_slash = False
        elif c == "\\":
            in_slash = True
        elif c == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    for i in range(len(term)):
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
    return None


def _unescape(value: str) -> str:
    out: list[str] = []
    in_slash = False
    for c in value:
        if in_slash:
            if c not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{c}")
            out.append(c)
            in_slash = False
        elif c == "\\":
            in_slash = True
        elif c in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {c}")
        else:
            out.append(c)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parses a field selector as the API server does; ``""``/None matches everything. Raises
    :class:`SelectorError` with the server's message. Which fields exist is checked separately
    (:func:`check_field_selector_fields`)."""
    text = text or ""
    if not text:
        return FieldSelector()
    reqs: list[tuple[str, bool, str]] = []
    for part in sorted(_split_terms(text)):
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        lhs, op, rhs = split
        reqs.append((lhs, op != "!=", _unescape(rhs)))
    return FieldSelector(tuple(reqs), text)


# Field labels the API server's conversion functions accept for built-in resources, by
# (group, resource); every other built-in resource accepts only metadata.name and metadata.namespace.
_FIELD_LABELS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset({
        "metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations",
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName",
        "spec.host"}),
    ("", "nodes"): frozenset({"metadata.name", "spec.unschedulable"}),
    ("", "namespaces"): frozenset({"metadata.name", "status.phase"}),
    ("", "secrets"): frozenset({"metadata.name", "metadata.namespace", "type"}),
    ("", "replicationcontrollers"): frozenset({"metadata.name", "metadata.namespace", "status.replicas"}),
    ("", "events"): frozenset({
        "metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
        "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
        "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
        "source", "type"}),
    ("apps", "replicasets"): frozenset({"metadata.name", "metadata.namespace", "status.replicas"}),
    ("batch", "jobs"): frozenset({"metadata.name", "metadata.namespace", "status.successful"}),
    ("certificates.k8s.io", "certificatesigningrequests"): frozenset({"metadata.name", "spec.signerName"}),
}
_DEFAULT_FIELD_LABELS = frozenset({"metadata.name", "metadata.namespace"})
_BUILTIN_GROUPS = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "networking.k8s.io", "rbac.authorization.k8s.io",
    "storage.k8s.io", "scheduling.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "node.k8s.io",
    "certificates.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "events.k8s.io",
    "flowcontrol.apiserver.k8s.io", "apiregistration.k8s.io", "resource.k8s.io", "storagemigration.k8s.io",
})


def supported_field_labels(group: str, resource: str) -> frozenset[str] | None:
    """The field labels the API server accepts in a field selector for a built-in resource; None for a
    resource it cannot know (a custom resource's ``selectableFields`` are the server's to say)."""
    if group not in _BUILTIN_GROUPS:
        return None
    return _FIELD_LABELS.get((group, resource), _DEFAULT_FIELD_LABELS)


def check_field_selector_fields(selector: FieldSelector, *, group: str, resource: str) -> None:
    """Raises :class:`SelectorError` with the API server's message when ``selector`` names a field the
    resource does not support."""
    supported = supported_field_labels(group, resource)
    if supported is None:
        return
    for field in selector.fields:
        if field in supported:
            continue
        if (group, resource) in _FIELD_LABELS:
            raise SelectorError(f"field label not supported: {field}")
        raise SelectorError(f'"{field}" is not a known field selector: only "metadata.name", '
                            '"metadata.namespace"')
