"""Fencing and the errors of the stores: what lets a deposed leader write nothing.

Every store of the delivery layer (checkpoints and known-object journals, in files, ConfigMaps or a
NATS KV bucket) writes under a ``fence``: a callable returning the writer's
:class:`~bridge.kube.leaderelection.FenceToken` (holder, lease term), or None once it no longer
leads. A fenced write is refused when the fence says None (:func:`fence_token`) and, by the
store's own compare-and-set, when the stored token is a later leader's (:func:`check_fence`). The
rules are written once here and applied by the one chunked writer (:mod:`bridge.storage.blobstore`).

    CheckpointError
    ├── CheckpointCorruptError   unreadable, truncated, wrong checksum/format: resync fully
    └── CheckpointStoreError     the store could not be reached or written: retry later
        ├── CheckpointFencedError   this writer no longer leads, or a later leader owns it
        └── BlobStoreError          a store primitive failed (also the journal's store error)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError
from bridge.kube.leaderelection import FenceToken

__all__ = ["BlobStoreError", "CheckpointCorruptError", "CheckpointError", "CheckpointFencedError",
           "CheckpointStoreError", "FenceSource", "check_fence", "fence_token", "token_json", "token_of"]


class CheckpointError(BridgeError):
    """Base of the checkpoint errors."""


class CheckpointCorruptError(CheckpointError):
    """A stored checkpoint cannot be trusted. The bridge warns and resyncs fully."""


class CheckpointStoreError(CheckpointError):
    """The store failed (unreachable, write refused). The previous checkpoint stays in place."""


class CheckpointFencedError(CheckpointStoreError):
    """The write (or load) was refused by fencing: this replica no longer leads, or a later leader
    owns the checkpoint. Nothing was written."""


class BlobStoreError(CheckpointStoreError):
    """A stored value could not be read or written (the API server refused, the data is too large,
    the stored head is malformed)."""


FenceSource = Callable[[], FenceToken | None]
"""The writer's current token; None once it no longer leads."""


def fence_token(fence: FenceSource | None, what: str) -> FenceToken | None:
    """The token a fenced store writes with; raises :class:`CheckpointFencedError` when the writer
    no longer leads. None for an unfenced store."""
    if fence is None:
        return None
    token = fence()
    if token is None:
        raise CheckpointFencedError(f"{what}: this replica is not the leader (any more); not written")
    return token


def check_fence(token: FenceToken | None, stored: FenceToken | None, what: str) -> None:
    """Raises :class:`CheckpointFencedError` when ``stored`` belongs to a later leader than
    ``token``."""
    if token is not None and stored is not None and not token.supersedes(stored):
        raise CheckpointFencedError(
            f"{what}: owned by {stored.holder!r} (lease term {stored.transitions}), a later leader than "
            f"{token.holder!r} (term {token.transitions}); refused"
        )


def token_json(token: FenceToken | None) -> list[Any] | None:
    """A token as every store keeps it in JSON: ``[leaseTransitions, holder]``."""
    return None if token is None else [token.transitions, token.holder]


def token_of(raw: Any) -> FenceToken | None:
    """The token :func:`token_json` wrote (None for None)."""
    return None if raw is None else FenceToken(transitions=int(raw[0]), holder=str(raw[1]))
