"""Which watched resources this replica runs, and how (docs/sharding.md).

Resources sharded **by object** are watched by every shard, each keeping the objects whose uid hashes
to its ordinal (:class:`~bridge.kube.sharding.ShardFilter`). Resources sharded **by resource** are
dealt out whole: sorted by their informer id (the resource and its scope), the ``i``-th goes to shard
``i mod total`` (round-robin: balanced, and the same in every replica). The resource keeps its
checkpoint id wherever it runs, so when it moves (the total changed, a resource was added) its new
shard resumes from the checkpoint its old one wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from bridge.delivery.pipeline import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.sharding import ShardFilter

__all__ = ["assign"]


def assign(watched: Sequence[WatchedResource], *, ordinal: int, total: int,
           strategies: Mapping[InformerKey, str]) -> list[WatchedResource]:
    """The resources this shard runs, each with its :attr:`~WatchedResource.shard`. ``strategies``:
    informer key → ``object`` or ``resource``."""
    whole = sorted((w for w in watched if strategies.get(w.key) == "resource"),
                   key=lambda w: w.base_informer_id)
    mine = {w.key for i, w in enumerate(whole) if i % total == ordinal}
    out: list[WatchedResource] = []
    for w in watched:
        if strategies.get(w.key) == "resource":
            if w.key in mine:
                out.append(dataclasses.replace(w, shard=ShardFilter(ordinal=0, total=1)))
        else:
            out.append(dataclasses.replace(w, shard=ShardFilter(ordinal=ordinal, total=total)))
    return out
