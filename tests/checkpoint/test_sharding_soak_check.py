"""The resharding soak's check of what the earlier totals left (tests/checkpoint/sharding_harness.py):
only the checkpoints of the last total's own shards may remain, whatever that total is."""

from __future__ import annotations

import pytest

from bridge.delivery.sharding import shard_id
from tests.checkpoint.sharding_harness import BASE_ID, left_over


@pytest.mark.parametrize("total", [1, 2, 3])
def test_the_last_totals_own_checkpoints_are_not_left_over(total: int) -> None:
    # One shard's checkpoint is the informer's own id (no "-of-1" ending): still the last total's.
    own = [shard_id(BASE_ID, o, total) for o in range(total)]
    assert left_over(own, total) == []


def test_every_earlier_totals_checkpoint_is_left_over() -> None:
    earlier = [shard_id(BASE_ID, o, t) for t in (1, 2, 4) for o in range(t)]
    assert left_over([*earlier, *(shard_id(BASE_ID, o, 3) for o in range(3))], 3) == earlier
    assert left_over([*earlier, BASE_ID], 1) == [i for i in earlier if i != BASE_ID]
    # An ordinal beyond the total is not one of its shards, though its name ends in "-of-3".
    assert left_over([f"{BASE_ID}.shard-5-of-3"], 3) == [f"{BASE_ID}.shard-5-of-3"]
