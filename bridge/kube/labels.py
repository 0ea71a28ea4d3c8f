"""Label and field selectors: :mod:`bridge.labels` (in the foundations, so that the sinks' routing
uses the same implementation), re-exported where the Kubernetes-facing modules look for it."""

from __future__ import annotations

from bridge.labels import (
    FieldSelector,
    LabelSelector,
    Operator,
    Requirement,
    SelectorError,
    check_field_selector_fields,
    parse_field_selector,
    parse_label_selector,
    supported_field_labels,
)

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
