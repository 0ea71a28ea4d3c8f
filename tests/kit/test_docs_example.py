"""docs/sinks.md, "Testing a sink": its example runs as written (a sink of one's own, checked against
the contract and a scripted webhook receiver) and imports nothing but the standard library,
``sinks.contract`` and ``bridge.testing``."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "sinks.md"
ALLOWED = ("sinks.contract", "bridge.testing")


def section_code(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"^```python\n(.*?)^```", text[start:end], re.S | re.M)
    assert len(blocks) == 1, f"one python example in {title!r}, found {len(blocks)}"
    return str(blocks[0])


def imported(code: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


def allowed(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] in sys.stdlib_module_names or module.startswith(ALLOWED)


def test_the_example_imports_only_the_stdlib_the_contract_and_the_kit() -> None:
    names = imported(section_code("Testing a sink"))
    assert {"sinks.contract", "bridge.testing"} <= names
    assert [m for m in names if not allowed(m)] == []


def test_the_example_runs() -> None:
    code = section_code("Testing a sink")
    assert sum(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(code))) >= 3  # what it checks
    namespace: dict[str, object] = {"__name__": "docs_testing_a_sink"}
    exec(compile(code, f"{DOC}:Testing a sink", "exec"), namespace)  # its own asserts check it
    assert "PostSink" in namespace
