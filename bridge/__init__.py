"""kube-event-bridge: client-go-style shared informers that forward Kubernetes object changes to sinks."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
