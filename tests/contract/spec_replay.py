"""Replays one schedule of the stateful specification (:mod:`tests.contract.test_spec_stateful`) as
Hypothesis printed it, in seconds: a failure of the long mode (no shrinking, thousands of schedules
before the failing one) is replayed without running its seed again.

The input is any text holding the printed schedule — the ``Failing test case`` block of a pytest
log (its ``E`` prefixes are dropped) or the block alone: ``state = DeliverySpec()`` and one
``state.<rule>(<keyword>=<literal>, ...)`` per step (``SinkShape(...)`` allowed among the literals),
up to ``state.teardown()``. Nothing else is run: each step is parsed (:mod:`ast`), not evaluated as
code. The invariant is checked after every step, as in the test, and the teardown judges the end.
Replay with the run's ``PYTHONHASHSEED`` (the bridge iterates sets of uids)::

    PYTHONHASHSEED=0 .venv/bin/python -m tests.contract.spec_replay failing.log
    scripts/spec-soak --schedule failing.log
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.contract.spec_driver import SinkShape

__all__ = ["parse_schedule", "replay"]

_PREFIX = re.compile(r"^(?:E(?=\s|$))?\s*")
"""pytest's ``E`` prefix of an assertion's lines, and the indentation."""


def _statements(text: str) -> Iterator[str]:
    """The schedule's statements, from ``state = DeliverySpec()`` to ``state.teardown()``."""
    lines = [_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "state = DeliverySpec()")
    except StopIteration:
        raise ValueError("no schedule (no line 'state = DeliverySpec()')") from None
    buf = ""
    for line in lines[start + 1:]:
        buf = f"{buf} {line.strip()}" if buf else line.strip()
        if buf.count("(") != buf.count(")") or buf.count("[") != buf.count("]"):
            continue
        statement, buf = buf, ""
        if statement == "state.teardown()":
            return
        if statement and statement != "state.nothing_invented_or_out_of_order_so_far()":
            yield statement  # (the invariant Hypothesis prints after each step is checked anyway)


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SinkShape" \
            and not node.args:
        return SinkShape(**{k.arg: _value(k.value) for k in node.keywords if k.arg is not None})
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    return ast.literal_eval(node)


def parse_schedule(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The steps of a printed schedule: (rule, keyword arguments), the first one ``begin``."""
    steps: list[tuple[str, dict[str, Any]]] = []
    for statement in _statements(text):
        call = ast.parse(statement, mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "state"
                and not call.args and all(k.arg for k in call.keywords)):
            raise ValueError(f"not a step of a schedule: {statement}")
        steps.append((call.func.attr, {str(k.arg): _value(k.value) for k in call.keywords}))
    if not steps or steps[0][0] != "begin":
        raise ValueError("a schedule starts with state.begin(...)")
    return steps


def _is_rule(cls: type, name: str) -> bool:
    method = getattr(cls, name, None)
    return any(hasattr(method, marker) for marker in
               ("hypothesis_stateful_rule", "hypothesis_stateful_initialize_rule"))


def replay(text: str) -> None:
    """Plays the schedule on a new :class:`DeliverySpec`; raises its AssertionError on a finding."""
    from tests.contract.test_spec_stateful import DeliverySpec

    steps = parse_schedule(text)
    for i, (rule, _) in enumerate(steps):
        if not _is_rule(DeliverySpec, rule):
            raise ValueError(f"step {i}: {rule} is not a rule of the specification")
    state = DeliverySpec()
    logging.disable(logging.WARNING)  # every crash logs its cancellations
    try:
        try:
            for rule, kwargs in steps:
                getattr(state, rule)(**kwargs)
                state.nothing_invented_or_out_of_order_so_far()
        except BaseException:
            state.loop.run_until_complete(state.bridge.close())
            state.loop.close()
            raise
        state.teardown()
    finally:
        logging.disable(logging.NOTSET)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.contract.spec_replay <file with a printed schedule>", file=sys.stderr)
        return 2
    try:
        replay(Path(argv[0]).read_text())
    except AssertionError as exc:
        print(exc)
        return 1
    print("the schedule keeps the contract")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
