"""Reading the configuration's YAML with its aliases bounded.

An alias (``*name``) stands for the whole node its anchor (``&name``) marks. PyYAML shares the node,
but everything that walks the loaded tree afterwards (``${file:}`` resolution, validation, the masked
dump) copies it once per alias: a few hundred bytes of nested aliases (a "billion laughs" document)
stand for billions of nodes. As yaml.v3 does, the document is refused when its aliases expand to more
than :data:`MAX_ALIAS_NODES` nodes in total, at composition (before any tree is built), naming the
line of the alias that crossed the limit. Ordinary configurations (an anchored block of sink options
used by a few sinks) stay far below it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent, NodeEvent
from yaml.nodes import MappingNode, Node, SequenceNode

__all__ = ["MAX_ALIAS_NODES", "AliasLimitError", "safe_load_bounded"]

MAX_ALIAS_NODES = 10_000
"""Nodes all of a document's aliases may stand for, together."""

class AliasLimitError(ComposerError):
    """The document's aliases expand to more nodes than allowed (or one refers to itself)."""


def _expanded_size(node: Node, sizes: dict[int, int], open_: set[int]) -> int:
    """Nodes ``node`` stands for once every alias under it is expanded (memoised per node)."""
    key = id(node)
    known = sizes.get(key)
    if known is not None:
        return known
    if key in open_:
        raise AliasLimitError(None, None, "an alias refers to the node that contains it",
                              node.start_mark)
    open_.add(key)
    total = 1
    if isinstance(node, SequenceNode):
        for item in node.value:
            total += _expanded_size(item, sizes, open_)
    elif isinstance(node, MappingNode):
        for k, v in node.value:
            total += _expanded_size(k, sizes, open_) + _expanded_size(v, sizes, open_)
    open_.discard(key)
    sizes[key] = total
    return total


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader counting what each alias expands to while composing (the pure-Python one: the C
    parser composes in C, out of reach; a configuration file is small)."""

    def __init__(self, stream: str, name: str) -> None:
        super().__init__(stream)
        self.name = name  # what the marks of errors name
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}
        self._composing: list[str] = []
        """Anchors of the nodes being composed (an alias to one of them would be a cycle)."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if event.anchor in self._composing:
                raise AliasLimitError(None, None, "an alias refers to the node that contains it",
                                      event.start_mark)
            node: Node | None = super().compose_node(parent, index)
            if node is not None:
                self._alias_nodes += _expanded_size(node, self._sizes, set())
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise AliasLimitError(
                        None, None,
                        f"the aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?); "
                        "write the repeated parts out or use fewer nested aliases",
                        event.start_mark)
            return node
        upcoming = self.peek_event()  # type: ignore[no-untyped-call]
        anchor = upcoming.anchor if isinstance(upcoming, NodeEvent) else None
        if anchor is not None:
            self._composing.append(anchor)
        try:
            result: Node | None = super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._composing.pop()
        return result


def safe_load_bounded(text: str, name: str = "<string>") -> Any:
    """``yaml.safe_load`` whose aliases may stand for at most :data:`MAX_ALIAS_NODES` nodes.
    Raises :class:`AliasLimitError` (a ``yaml.YAMLError`` naming the line) beyond it."""
    loader = _BoundedLoader(text, name)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
