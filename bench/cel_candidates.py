"""The comparison behind the choice of CEL library (docs/filters.md, *Why this CEL library*).

Runs, for each candidate installed in the current interpreter (``cel-expr-python``, Google's C++
runtime; ``common-expression-language``, Rust-backed; ``cel-python``, pure Python), a set of cases
whose answers the CEL language definition fixes (error absorption by ``&&`` / ``||``, heterogeneous
equality, overflow, ``has()``, optional fields, timestamps and durations, macros, strings), then
Kubernetes-style filters over a whole Pod, and what the library says at compile time about a bad
expression (syntax, unknown function, wrong type). It then times one compiled program per event on
a small mapping and on the whole Pod, handed whole, as each library takes its input.

Only ``cel-expr-python`` is a dependency of the project: install the others into a scratch virtual
environment to run this (``pip install cel-expr-python common-expression-language cel-python
orjson``), with a Pod written by ``python -c "from bridge.sim.objects import make_pod; …"`` or any
Pod's JSON, e.g. ``python -m bench.cel_candidates --pod pod.json`` from the repository's root.
"""

from __future__ import annotations

import argparse
import copy
import json
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

Runner = Callable[[str, dict[str, Any]], Any]
"""Compiles and evaluates an expression; returns the value, or raises on any error."""

ERROR = "<error>"

# (expression, variables, expected: a value, or ERROR for an evaluation error)
SPEC_CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("1 + 2 * 3 == 7", {}, True),
    ("9223372036854775807 + 1 == 0", {}, ERROR),  # int64 overflow is an error
    ("1 / 0 == 0", {}, ERROR),
    ("false && (1 / 0 == 0)", {}, False),  # && absorbs an error when the other side decides
    ("(1 / 0 == 0) || true", {}, True),
    ("1 == 1.0", {}, True),  # heterogeneous numeric equality
    ("1u == 1", {}, True),
    ("'a' == 1", {}, False),
    ("[1, 2] + [3] == [1, 2, 3]", {}, True),
    ("{'a': 1}.a == 1", {}, True),
    ("has({'a': 1}.b)", {}, False),
    ("{'a': 1}.b == 1", {}, ERROR),  # a missing key without has() is an error
    ("size('héllo') == 5", {}, True),
    ("'abc'.startsWith('ab') && 'abc'.endsWith('bc') && 'abc'.contains('b')", {}, True),
    ("'abc'.matches('^a.c$')", {}, True),
    ("[1, 2, 3].exists(x, x > 2) && [1, 2, 3].all(x, x > 0)", {}, True),
    ("[1, 2, 3].exists_one(x, x > 1)", {}, False),
    ("[1, 2, 3].map(x, x * 2) == [2, 4, 6]", {}, True),
    ("[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]", {}, True),
    ("timestamp('2026-01-01T00:00:00Z') + duration('1h') == timestamp('2026-01-01T01:00:00Z')", {}, True),
    ("timestamp('2026-03-01T12:30:00Z').getHours() == 12", {}, True),
    ("duration('90s') > duration('1m')", {}, True),
    ("int('42') == 42 && string(42) == '42' && double(1) == 1.0", {}, True),
    ("b'abc' == bytes('abc')", {}, True),
    ("type(1) == int && type('a') == string", {}, True),
    ("x.?a.orValue(7) == 7", {"x": {}}, True),
    ("x.?a.b.orValue(0) == 1", {"x": {"a": {"b": 1}}}, True),
    ("'k' in {'k': 1} && 2 in [1, 2]", {}, True),
    ("null == null && x == null", {"x": None}, True),
]

# Kubernetes-style filters over a whole Pod (its phase Running, owned by a ReplicaSet)
K8S_CASES: list[tuple[str, Any]] = [
    ("object.status.phase == 'Running'", True),
    ("has(object.status.reason) && object.status.reason == 'Evicted'", False),
    ("object.status.reason == 'Evicted'", ERROR),
    ("object.metadata.ownerReferences.exists(o, o.kind == 'ReplicaSet')", True),
    ("object.spec.containers.all(c, c.image.contains('/'))", True),
    ("object.metadata.?labels.team.orValue('') == 'payments'", False),
    ("timestamp(object.status.startTime) < timestamp('2100-01-01T00:00:00Z')", True),
    ("oldObject == null", True),
    ("size(object.metadata.labels) > 0", True),
]

# Refused when compiled (no object needed to tell)
BAD: list[tuple[str, str]] = [
    ("syntax", "object.status.phase =="),
    ("unknown function", "object.metadata.name.frobnicate() == 'x'"),
    ("wrong type", "'a' + 1 == 'b'"),
]


def _google() -> tuple[str, Callable[[str], Any], Callable[[Any, dict[str, Any]], Any]] | None:
    try:
        from cel_expr_python import cel
        from cel_expr_python.ext import ext_optional, ext_strings
    except ImportError:
        return None
    env = cel.NewEnv(variables={n: cel.Type.DYN for n in ("object", "oldObject", "x")},
                     extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()])

    def run(program: Any, data: dict[str, Any]) -> Any:
        value = program.eval(data=data)
        if value.type() == cel.Type.ERROR:
            raise RuntimeError(value.value())
        return value.value()

    return "cel-expr-python", env.compile, run


def _rust() -> tuple[str, Callable[[str], Any], Callable[[Any, dict[str, Any]], Any]] | None:
    try:
        import cel  # type: ignore[import-not-found]
    except ImportError:
        return None
    if not hasattr(cel, "compile"):
        return None
    return "common-expression-language", cel.compile, lambda program, data: program.execute(data)


def _celpy() -> tuple[str, Callable[[str], Any], Callable[[Any, dict[str, Any]], Any]] | None:
    try:
        import celpy  # type: ignore[import-not-found]
    except ImportError:
        return None
    env = celpy.Environment()

    def compile_(source: str) -> Any:
        return env.program(env.compile(source))

    def run(program: Any, data: dict[str, Any]) -> Any:
        result = program.evaluate({k: celpy.json_to_cel(v) for k, v in data.items()})
        if isinstance(result, Exception):
            raise RuntimeError(result)
        return result

    return "cel-python", compile_, run


def _answer(compile_: Callable[[str], Any], run: Callable[[Any, dict[str, Any]], Any], source: str,
            data: dict[str, Any]) -> Any:
    try:
        return run(compile_(source), copy.deepcopy(data))
    except Exception:
        return ERROR


def _time(run: Callable[[Any, dict[str, Any]], Any], program: Any, obj: dict[str, Any], n: int) -> float:
    """µs per evaluation of ``program`` with ``obj`` as ``object`` (best of three)."""
    return min(timeit.repeat(lambda: run(program, {"object": obj}), number=n, repeat=3)) / n * 1e6


def evaluate(pod: dict[str, Any]) -> dict[str, Any]:
    small = {"metadata": {"name": "web-0", "labels": {"team": "payments"}}, "status": {"phase": "Failed"}}
    report: dict[str, Any] = {}
    for candidate in (_google(), _rust(), _celpy()):
        if candidate is None:
            continue
        name, compile_, run = candidate
        spec_failures = [src for src, data, want in SPEC_CASES
                         if _answer(compile_, run, src, data) != want]
        k8s_failures = [src for src, want in K8S_CASES
                        if _answer(compile_, run, src, {"object": pod, "oldObject": None}) != want]
        refused: dict[str, str | None] = {}
        for what, source in BAD:
            try:
                compile_(source)
            except Exception as exc:
                refused[what] = str(exc).splitlines()[0][:120]
            else:
                refused[what] = None
        program = compile_("object.status.phase == 'Failed' && object.metadata.labels.team == 'payments'")
        n = 2000
        small_us = _time(run, program, small, n)
        pod_us = _time(run, program, pod, n // 4)
        report[name] = {
            "spec_cases": f"{len(SPEC_CASES) - len(spec_failures)}/{len(SPEC_CASES)}",
            "spec_failures": spec_failures,
            "k8s_cases": f"{len(K8S_CASES) - len(k8s_failures)}/{len(K8S_CASES)}",
            "k8s_failures": k8s_failures,
            "refused_at_compile": refused,
            "small_us": round(small_us, 1),
            "whole_pod_us": round(pod_us, 1),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pod", type=Path, required=True, help="a Pod's JSON")
    args = parser.parse_args()
    pod = json.loads(args.pod.read_text())
    print(json.dumps(evaluate(pod), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
