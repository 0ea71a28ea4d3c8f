"""The one way the bridge reads and compares resourceVersions (checkpoints, progress, the cache).

A resourceVersion is opaque to clients in general; the bridge compares them because it needs order
(what a sink has, what a checkpoint covers, what a replay may send), and it relies on what every
Kubernetes API server backed by etcd gives: a decimal etcd revision. Text that is not one parses to
None and compares as unknown — never older, never newer — wherever a decision depends on it.
"""

from __future__ import annotations

from typing import NewType

__all__ = ["ResourceVersion", "is_rv", "parse_rv", "rv_at_most"]

ResourceVersion = NewType("ResourceVersion", int)
"""A resourceVersion as the bridge compares them: an etcd revision."""


def parse_rv(text: str) -> ResourceVersion | None:
    """``text`` as a :data:`ResourceVersion`; None when it is not one."""
    return ResourceVersion(int(text)) if text.isascii() and text.isdigit() else None


def is_rv(value: object) -> bool:
    """Whether ``value`` is a resourceVersion's text (a record read back from a store)."""
    return isinstance(value, str) and parse_rv(value) is not None


def rv_at_most(rv: str, limit: str) -> bool:
    """Whether ``rv`` is no newer than ``limit`` (False when either is not a resourceVersion)."""
    a, b = parse_rv(rv), parse_rv(limit)
    return a is not None and b is not None and a <= b
