"""CEL's own conformance cases, as many as can run without protocol buffers, against each candidate
library (docs/filters.md, *Why this CEL library*).

CEL's specification repository (``google/cel-spec``) keeps its conformance tests as text-format
files, ``tests/simple/testdata/*.textproto``. This reads the tests of a directory of them that need
nothing but the expression — no variables (``bindings``), no type environment, no container, no
proto messages — and whose expected answer is a scalar (``bool``, ``int64``, ``uint64``,
``double``, ``string``, ``null``) or an evaluation error, and that are meant to be type-checked
(not ``disable_check``: the bridge always checks), runs each in every candidate installed in
the current interpreter (the same ones as :mod:`bench.cel_candidates`), and counts the answers that
match, file by file. A compile-time refusal counts as an error (the cases expecting an evaluation
error then match it; those expecting a value do not). Run it in a scratch environment with the
candidates installed: ``python -m bench.cel_conformance DIR`` from the repository's root.
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cel_candidates import _celpy, _google, _rust

ERROR = object()
_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_SKIP = ("bindings", "type_env", "container:", "disable_macros", "check_only", "object_value",
         "typed_result", "any_error", "unknown", "disable_check")
"""Tests needing more than an expression, or evaluated without the type checker (the bridge always
checks)."""


def _unquote(literal: str) -> str:
    # \uXXXX (not \\uXXXX, an escaped backslash before a u) names a code point
    body = re.sub(r"(?<!\\)((?:\\\\)*)\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))",
                  lambda m: m.group(1) + chr(int(m.group(2) or m.group(3), 16)), literal[1:-1])
    with warnings.catch_warnings():  # a textproto escape Python does not know stays as it is
        warnings.simplefilter("ignore", DeprecationWarning)
        decoded: bytes = codecs.escape_decode(body.encode("utf-8"))[0]
    return decoded.decode("utf-8")


def _blocks(text: str, keyword: str) -> Iterator[str]:
    """The bodies of the ``keyword { … }`` blocks of ``text`` (braces inside strings ignored)."""
    for match in re.finditer(rf"\b{keyword}\s*{{", text):
        depth, i = 0, match.end() - 1
        while i < len(text):
            ch = text[i]
            if ch in "\"'":
                end = re.compile(_STRING).match(text, i)
                i = end.end() if end else i + 1
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    yield text[match.end(): i]
                    break
            i += 1


def _expected(body: str) -> Any:
    if re.search(r"\beval_error\s*[:{]", body):
        return ERROR
    start = re.search(r"\bvalue\s*:?\s*{", body)
    if start is None:
        return ...
    value = re.compile(r"\s*(\w+)\s*:\s*(" + _STRING + r"|[^\s}]+)\s*}").match(body, start.end())
    if value is None:
        return ...  # a list, a map, a message: not compared here
    kind, raw = value.groups()
    if kind == "bool_value":
        return raw == "true"
    if kind in ("int64_value", "uint64_value"):
        return int(raw)
    if kind == "double_value":
        return float(raw)
    if kind == "string_value":
        return _unquote(raw)
    if kind == "null_value":
        return None if raw == "NULL_VALUE" else ERROR
    return ...  # a kind this runner does not compare


def cases(path: Path) -> Iterator[tuple[str, str, Any]]:
    """(name, expression, expected) for each runnable test of one file."""
    text = path.read_text()
    for body in _blocks(text, "test"):
        if any(word in body for word in _SKIP):
            continue
        expr = re.search(r"\bexpr\s*:\s*((?:(?:" + _STRING + r")\s*)+)", body)
        if expr is None:
            continue
        source = "".join(_unquote(s) for s in re.findall(_STRING, expr.group(1)))
        want = _expected(body)
        if want is ...:
            continue
        name = re.search(r"\bname\s*:\s*(" + _STRING + ")", body)
        yield (_unquote(name.group(1)) if name else "?"), source, want


def _same(got: Any, want: Any) -> bool:
    if want is ERROR:
        return got is ERROR
    if got is ERROR:
        return False
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(want, float):
        return isinstance(got, (int, float)) and (got == want or (math.isnan(want) and math.isnan(got)))
    if want is None:
        return got is None
    return type(got) is type(want) and bool(got == want)


def run(directory: Path) -> dict[str, dict[str, str]]:
    report: dict[str, dict[str, str]] = {}
    for candidate in (_google(), _rust(), _celpy()):
        if candidate is None:
            continue
        name, compile_, evaluate = candidate
        per_file: dict[str, str] = {}
        total = passed = 0
        for path in sorted(directory.glob("*.textproto")):
            ok = n = 0
            for _, source, want in cases(path):
                got: Any
                try:
                    got = evaluate(compile_(source), {})
                except Exception:
                    got = ERROR
                if hasattr(got, "__class__") and got.__class__.__module__.startswith("celpy"):
                    got = _plain(got)
                n += 1
                ok += _same(got, want)
            per_file[path.stem] = f"{ok}/{n}"
            total += n
            passed += ok
        per_file["all"] = f"{passed}/{total}"
        report[name] = per_file
    return report


def _plain(value: Any) -> Any:
    """cel-python's values as Python's (its ints, strings and bools are subclasses)."""
    if type(value).__name__ == "BoolType":
        return bool(value)
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="cel-spec's tests/simple/testdata, or some of it")
    args = parser.parse_args()
    print(json.dumps(run(args.directory), indent=2))


if __name__ == "__main__":
    main()
