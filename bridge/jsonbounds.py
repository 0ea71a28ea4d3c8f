"""Bounds on the JSON the bridge reads from outside, checked before a recursive decoder sees it.

msgspec and orjson recurse once per nesting level: msgspec raises ``RecursionError`` from about 1000
levels (fewer the deeper the caller's own stack), orjson's ``loads`` refuses 1024 and its ``dumps``
254. An object the API server holds can nest deeper than any of these (a CRD with
``x-kubernetes-preserve-unknown-fields``), and an object that decodes at 300 levels still fails later,
where a sink encodes it again. So every decode of API input first asks :func:`exceeds_depth`: at most
:data:`MAX_DEPTH` levels pass, below orjson's re-encoding limit with room for the envelope a sink
wraps around an object (``{"data": {"object": …}}``); what is deeper, or larger than
:data:`MAX_OBJECT_BYTES`, is *quarantined* by the caller (:func:`bridge.kube.bounded.malformed_object`).

The check is meant for the hot path: a text with at most ``limit`` brackets in all (strings
included) cannot nest deeper, and one ``bytes.translate`` says so (the cheapest count of several
characters Python has: two ``bytes.count`` calls cost half as much again); only a text with more brackets
is measured exactly (strings cut out, brackets kept, innermost pairs removed a level per pass, all
in C). :func:`members` and :func:`elements` walk one level of a container without recursing (one
regular-expression match per string or structural byte): the quarantine reads an object's identity
with them, and a List too deep for the decoder is split into its items with them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = [
    "MAX_DEPTH",
    "MAX_OBJECT_BYTES",
    "NOT_BRACKETS",
    "depth",
    "elements",
    "exceeds_depth",
    "members",
]

MAX_DEPTH = 200
"""The deepest nesting (containers within containers, the object's own braces counting as one) an
object may have to be decoded; deeper ones are quarantined."""

MAX_OBJECT_BYTES = 16 * 1024 * 1024
"""The largest object (its JSON) decoded; larger ones are quarantined. etcd keeps objects up to
about 1.5 MiB by default; a watch line is cut off at 64 MiB before it is read at all
(``ApiClientOptions.max_line_bytes``)."""

NOT_BRACKETS = bytes(b for b in range(256) if b not in b"{}[]")
"""Every byte but the brackets: ``len(text.translate(None, NOT_BRACKETS))`` counts a text's brackets,
the first step of :func:`exceeds_depth`, which a hot path takes without calling it."""

_MARKS = bytes.maketrans(b"[]", b"{}")
_NOT_MARKS = bytes(b for b in range(256) if b not in b'{}[]"')
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]', re.DOTALL)
_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")
_COMMA = ord(",")
_QUOTE = ord('"')


def exceeds_depth(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``data`` nests deeper than ``limit`` levels (brackets inside strings do
    not count). One pass (a translate keeping brackets and quotes) for an object with at most
    ``2 * limit`` brackets (nearly every object: nesting deeper takes more, each level opens and
    closes one); the exact measure above, on what that pass kept."""
    marks = data.translate(_MARKS, _NOT_MARKS)
    brackets = len(marks) - marks.count(b'"')
    if brackets <= 2 * limit:
        # Deeper nesting needs more (JSON pairs its brackets). A text that does not pair them is not
        # JSON: the decoder refuses it, after at most this many levels.
        return False
    return _levels(_strings_cut(data, marks), limit) > limit


def depth(data: bytes, *, stop: int | None = None) -> int:
    """The nesting depth of the JSON text ``data``; counting stops once past ``stop``. For a text
    whose brackets do not pair up (not JSON), at least the depth a recursive decoder would reach
    before it fails."""
    return _levels(_strings_cut(data, data.translate(_MARKS, _NOT_MARKS)), stop)


def _strings_cut(data: bytes, marks: bytes) -> bytes:
    """The brackets of ``data`` outside its strings (``[]`` written ``{}``: only the depth matters),
    from ``marks``, its brackets and quotes.

    In C but for a step per backslash: where a backslash precedes a quote, escaped characters are cut
    out of ``data`` first (and its marks taken again), so that every quote left delimits a string;
    then two adjacent quotes are dropped (an empty string, or two strings merged: what lies outside
    strings stays as it is), and of what is left (strings holding brackets, rare) what lies between
    two quotes."""
    if b'\\"' in data:
        marks = _without_escapes(data).translate(_MARKS, _NOT_MARKS)
    marks = marks.replace(b'""', b"")
    if b'"' in marks:
        marks = b"".join(marks.split(b'"')[0::2])
    return marks


def _without_escapes(data: bytes) -> bytes:
    """``data`` without its backslashes and the character each escapes (``\\\\`` as a pair)."""
    parts = data.split(b"\\")
    kept = [parts[0]]
    i, n = 1, len(parts)
    while i < n:
        part = parts[i]
        if part:
            kept.append(part[1:])  # the backslash before it escaped its first character
            i += 1
        else:  # two backslashes in a row: the second was the escaped one, what follows is plain
            if i + 1 < n:
                kept.append(parts[i + 1])
            i += 2
    return b"".join(kept)


def _levels(marks: bytes, stop: int | None) -> int:
    """The depth of a text of ``{`` and ``}``: each pass removes every innermost pair, one level."""
    levels = 0
    while marks:
        inner = marks.replace(b"{}", b"")
        if len(inner) == len(marks):
            return levels + marks.count(b"{")  # unpaired: not JSON
        levels += 1
        if stop is not None and levels > stop:
            return levels
        marks = inner
    return levels


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The spans of the children of the container opening at or after ``start`` (an object's
    members ``"key": value`` or an array's elements), without whitespace trimmed, up to ``end``.
    Stops early at a container that does not close before ``end``."""
    level = 0
    begin = -1
    for m in _TOKEN.finditer(data, start, end):
        c = data[m.start()]
        if c == _QUOTE:
            continue
        if c in _OPEN:
            level += 1
            if level == 1:
                begin = m.end()
        elif c in _CLOSE:
            level -= 1
            if level == 0:
                if data[begin:m.start()].strip():
                    yield begin, m.start()
                return
            if level < 0:
                return
        elif c == _COMMA and level == 1:
            yield begin, m.start()
            begin = m.end()


_KEY = re.compile(rb'\s*"([^"\\]*(?:\\.[^"\\]*)*)"\s*:\s*', re.DOTALL)


def members(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, int, int]]:
    """``(key, value start, value end)`` for each member of the JSON object at ``start``, one level
    only (the key as written, escapes not undone). Never recurses; stops where the text stops making
    sense."""
    stop = len(data) if end is None else end
    for s, e in _children(data, start, stop):
        m = _KEY.match(data, s, e)
        if m is None:
            return
        value_end = e
        while value_end > m.end() and data[value_end - 1] in b" \t\r\n":
            value_end -= 1
        yield m[1], m.end(), value_end


def elements(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each element of the JSON array at ``start``, whitespace trimmed."""
    stop = len(data) if end is None else end
    for begin, end_ in _children(data, start, stop):
        s, e = begin, end_
        while s < e and data[s] in b" \t\r\n":
            s += 1
        while e > s and data[e - 1] in b" \t\r\n":
            e -= 1
        yield s, e
