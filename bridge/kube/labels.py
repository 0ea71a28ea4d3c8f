"""Label and field selectors, parsed and matched as the API server does.

Used by the listers (local queries over the cache), the simulator (server-side filtering) and the
per-sink routing filters. A leaf module: it imports nothing from the rest of the package.

Label selector grammar (``k8s.io/apimachinery/pkg/labels``)::

    selector    := requirement ("," requirement)*
    requirement := key ("=" | "==" | "!=") value
                 | key ("in" | "notin") "(" value ("," value)* ")"
                 | key | "!" key

Field selectors support ``=``, ``==`` and ``!=`` over dotted paths (``metadata.name``).
"""

from __future__ import annotations

import enum
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
    "parse_field_selector",
    "parse_label_selector",
]


class SelectorError(ValueError):
    """A selector string does not parse; the message says where."""


class Operator(enum.Enum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"


_KEY = r"[A-Za-z0-9]([A-Za-z0-9_.\-/]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?)?"
_KEY_RE = re.compile(rf"^{_KEY}$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")


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


def _split_top_level(text: str) -> list[str]:
    """Splits on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in selector {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise SelectorError(f"unbalanced '(' in selector {text!r}")
    parts.append("".join(current))
    return parts


def _check_key(key: str, text: str) -> str:
    if not _KEY_RE.match(key) or len(key) > 317:
        raise SelectorError(f"invalid label key {key!r} in selector {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if not _VALUE_RE.match(value) or len(value) > 63:
        raise SelectorError(f"invalid label value {value!r} in selector {text!r}")
    return value


_SET_RE = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


def _parse_requirement(part: str, text: str) -> Requirement:
    part = part.strip()
    if not part:
        raise SelectorError(f"empty requirement in selector {text!r}")
    m = _SET_RE.match(part)
    if m:
        key = _check_key(m["key"], text)
        values = frozenset(_check_value(v.strip(), text) for v in m["values"].split(","))
        op = Operator.IN if m["op"] == "in" else Operator.NOT_IN
        return Requirement(key, op, values)
    for token, op in (("!=", Operator.NOT_EQUALS), ("==", Operator.EQUALS), ("=", Operator.EQUALS)):
        if token in part:
            key, _, value = part.partition(token)
            return Requirement(_check_key(key.strip(), text), op,
                               frozenset({_check_value(value.strip(), text)}))
    if part.startswith("!"):
        return Requirement(_check_key(part[1:].strip(), text), Operator.DOES_NOT_EXIST)
    return Requirement(_check_key(part, text), Operator.EXISTS)


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parses a label selector string; ``""``/None gives the selector that matches everything."""
    text = (text or "").strip()
    if not text:
        return LabelSelector()
    reqs = tuple(_parse_requirement(p, text) for p in _split_top_level(text))
    return LabelSelector(reqs, text)


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


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parses a field selector string; ``""``/None matches everything."""
    text = (text or "").strip()
    if not text:
        return FieldSelector()
    reqs: list[tuple[str, bool, str]] = []
    for raw in text.split(","):
        part = raw.strip()
        for token, eq in (("!=", False), ("==", True), ("=", True)):
            if token in part:
                path, _, value = part.partition(token)
                path = path.strip()
                if not path:
                    raise SelectorError(f"missing field path in field selector {text!r}")
                reqs.append((path, eq, value.strip()))
                break
        else:
            raise SelectorError(f"field selector requirement {part!r} needs '=', '==' or '!=' ({text!r})")
    return FieldSelector(tuple(reqs), text)
