"""Text that ``str.isdigit`` accepts but that is not a resourceVersion (a superscript "²", which
``int`` refuses, Arabic-Indic "١٢", which ``int`` reads as 12): every place that reads a
resourceVersion or a fencing term treats it as not one, as the delivery layer's parser does."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.contracts import WatchEventType
from bridge.delivery.assembly import WatchedResource
from bridge.informer.factory import InformerKey
from bridge.kube.discovery import APIResource
from bridge.kube.listwatch import decode_watch_event
from bridge.kube.sharding import ShardFilter, shard_of, sharded_decoder
from bridge.service.events.enrichment import Enricher, _rv_int
from bridge.service.events.profile import EventsProfile
from bridge.service.events.wiring import set_replay_point
from bridge.storage.checkpoint import Checkpoint, FileCheckpointStore
from bridge.storage.checkpoint_configmap import TERM_ANNOTATION, _stored_token
from sinks.contract import ResourceRef
from tests.api.test_sharding_decode import UIDS, line

NOT_RVS = ("²", "١٢", "")
EVENTS = WatchedResource(
    key=InformerKey("events"),
    api=APIResource(group="", version="v1", resource="events", kind="Event", namespaced=True),
    ref=ResourceRef(group="", version="v1", resource="events", kind="Event"))


@pytest.mark.parametrize("rv", [*NOT_RVS, "40", "101"])
def test_a_shard_with_floors_keeps_an_event_whose_resource_version_is_not_one(rv: str) -> None:
    shard = ShardFilter(ordinal=0, total=1)
    shard.set_floors(1, {0: 100})
    uid = UIDS[0]
    kept = rv not in ("40",)  # at or below the floor: delivered before; not a resourceVersion: kept
    assert shard.keeps_event(uid, rv) is kept
    ev = sharded_decoder(decode_watch_event, shard)(line("MODIFIED", uid, rv))
    assert (ev.type is WatchEventType.MODIFIED) is kept
    two = ShardFilter(ordinal=shard_of(uid, 2), total=2)
    two.set_floors(2, {0: 100, 1: 100})
    assert two.keeps_event(uid, rv) is kept


@pytest.mark.parametrize("term", ["²", "١٢", "", "-\u0661", "7", "-1"])
def test_a_stored_fencing_term_is_read_only_when_it_is_decimal(term: str) -> None:
    token = _stored_token({"metadata": {"annotations": {TERM_ANNOTATION: term}}})
    if term in ("7", "-1"):
        assert token is not None
        assert token.transitions == int(term)
    else:
        assert token is None


@pytest.mark.parametrize("rv", [*NOT_RVS, "12"])
def test_the_enrichment_reads_only_decimal_resource_versions(rv: str) -> None:
    assert _rv_int(rv) == (12 if rv == "12" else None)


@pytest.mark.parametrize("rv", [*NOT_RVS, "12"])
async def test_the_replay_point_comes_only_from_decimal_checkpoints(tmp_path: Path, rv: str) -> None:
    store = FileCheckpointStore(directory=tmp_path, fsync=False)
    await store.save(Checkpoint(informer_id=EVENTS.informer_id, resource_version=rv))
    enricher = Enricher(client=None, discovery=None, clock=None, kinds=["pods"])  # type: ignore[arg-type]
    profile = EventsProfile(profiled=lambda ref: True, enricher=enricher, counter=None)
    await set_replay_point(profile, store, [EVENTS])
    assert enricher.replay_since == ("12" if rv == "12" else "")
