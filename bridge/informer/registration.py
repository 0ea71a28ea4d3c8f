"""What an informer hands its callers: the handle of one registered handler, and its errors."""

from __future__ import annotations

from bridge.errors import BridgeError
from bridge.informer.processor import ListenerStats, ProcessorListener

__all__ = ["HandlerRegistration", "InformerError", "InformerStartedError"]


class InformerError(BridgeError):
    """The informer was misused or one of its tasks failed."""


class InformerStartedError(InformerError):
    """An operation allowed only before :meth:`SharedIndexInformer.run` was called after it."""


class HandlerRegistration:
    """What :meth:`SharedIndexInformer.add_event_handler` returns: the handle of one listener."""

    def __init__(self, *, listener: ProcessorListener) -> None:
        self._listener = listener

    @property
    def name(self) -> str:
        """The listener's unique name (as the DeliveryObserver sees it)."""
        return self._listener.name

    @property
    def listener(self) -> ProcessorListener:
        return self._listener

    @property
    def resync_period(self) -> float:
        """The resync period in effect after clamping (0 = never)."""
        return self._listener.resync_period

    def has_synced(self) -> bool:
        """True once the informer synced and this handler was given every initial-list object."""
        return self._listener.has_synced()

    def stats(self) -> ListenerStats:
        return self._listener.stats()

    def __repr__(self) -> str:
        return f"HandlerRegistration(name={self.name!r})"
