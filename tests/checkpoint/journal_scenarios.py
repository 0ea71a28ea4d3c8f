"""Scenarios every shared journal store must pass, run by each store's own test module against its
real backend (``test_journal_configmap.py``: the simulator; ``test_journal_natskv.py``: a real
nats-server), so that both stores are held to the same lines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from bridge.delivery.journal import JournalBackend
from bridge.kube.leaderelection import FenceToken
from bridge.storage.checkpoint import CheckpointFencedError
from tests.checkpoint.test_fencing import Term
from tests.checkpoint.test_journal import IDENT

HEAD = b'{"journal":1,"informer_id":"' + IDENT.encode() + b'"}\n'
"""The first line of a journal of :data:`IDENT`."""
DEPOSED = FenceToken(transitions=0, holder="a")
"""The deposed leader's fence token."""
SUCCESSOR = FenceToken(transitions=1, holder="b")
"""Its successor's: one leadership transition later."""


@dataclass(frozen=True, slots=True)
class FencedJournals:
    """Two backends of one store over the same journal: the deposed leader's and its successor's,
    each fenced by its own term."""

    old: JournalBackend
    """Fenced by a term holding :data:`DEPOSED`."""
    new: JournalBackend
    """Fenced by ``successor``, a term holding :data:`SUCCESSOR`."""
    successor: Term
    """The new backend's term; the scenario ends it (leadership lost)."""
    records: Callable[[], Awaitable[list[object]]]
    """The records the store holds now (the journal's lines after its header), read from the
    store itself."""
    check_successor_mark: Callable[[], Awaitable[None]]
    """Asserts that the stored journal carries the successor's fence (the store's own form of it)."""


async def a_deposed_leader_cannot_write_the_journal_its_successor_wrote(pair: FencedJournals) -> None:
    """The old leader writes first; its successor reads and rewrites; from then on the old one's
    append and read are refused ("later leader") and change nothing; once the successor loses its
    term too, it writes nothing either."""
    old, new = pair.old, pair.new
    assert await old.read() is None
    await old.rewrite(HEAD)
    await old.append(b'["a","ns/a","u-a","12"]\n')
    assert await new.read() == HEAD + b'["a","ns/a","u-a","12"]\n'
    await new.rewrite(HEAD + b'["a","ns/b","u-b","13"]\n')
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.append(b'["d","ns/b","u-b","14",false]\n')
    with pytest.raises(CheckpointFencedError, match="later leader"):
        await old.read()
    assert await pair.records() == [["a", "ns/b", "u-b", "13"]]
    await pair.check_successor_mark()
    pair.successor.token = None  # leadership lost: no write at all
    with pytest.raises(CheckpointFencedError):
        await new.append(b'["a","ns/c","u-c","15"]\n')
    assert await pair.records() == [["a", "ns/b", "u-b", "13"]]
