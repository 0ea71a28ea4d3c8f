"""Test helpers shipped with the package: fakes of the bridge's contracts that record what happened.

They live in the package (not under ``tests/``) so that every test module, the benchmarks and
third-party sink and plugin authors (docs/sinks.md, "Testing a sink") can drive an informer without a
real API server, stand in for a destination or a store, and check a sink of their own. They target
the stable contracts only (:mod:`sinks.contract`, the store Protocols of :mod:`bridge.storage`), so a
rework of the built-in sinks' internals does not change what they do:

- :mod:`~bridge.testing.fake_source`, :mod:`~bridge.testing.recorder`: a fake ListerWatcher and a
  recording event handler;
- :mod:`~bridge.testing.loop`: waiting by turns of the event loop, never the wall clock, and an
  informer run for the length of a block;
- :mod:`~bridge.testing.sink`: a recording sink whose acknowledgements, failures and delays are
  scripted;
- :mod:`~bridge.testing.acks`: acknowledgement recorders, a contract check for any sink, event
  builders;
- :mod:`~bridge.testing.stores`: in-memory blob, checkpoint and journal stores;
- :mod:`~bridge.testing.receiver`: a webhook receiver over real HTTP with scripted answers;
- :mod:`~bridge.testing.files`: the complete lines of a file a sink may still be appending to.
"""

from __future__ import annotations

from bridge.testing.acks import PODS, AckRecorder, ContractBreach, change_event, deliver_all, kube_object
from bridge.testing.fake_source import (
    INITIAL_EVENTS_END_ANNOTATION,
    FakeControllerSource,
    FakeWatchStream,
    SourceCall,
    expired_status,
    object_key_of,
)
from bridge.testing.files import written_events, written_lines
from bridge.testing.loop import SPIN_TURNS, running_informer, spin_until
from bridge.testing.receiver import ReceivedRequest, Reply, Responder, WebhookReceiver, decode_cloudevents
from bridge.testing.recorder import Call, RecordingHandler, UnknownObjectError, apply_calls
from bridge.testing.sink import RecordingBatchSink, RecordingSink, Step
from bridge.testing.stores import (
    BareCheckpointStore,
    MemoryBlobs,
    MemoryBlobStore,
    MemoryCheckpointStore,
    MemoryJournal,
)

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "PODS",
    "SPIN_TURNS",
    "AckRecorder",
    "BareCheckpointStore",
    "Call",
    "ContractBreach",
    "FakeControllerSource",
    "FakeWatchStream",
    "MemoryBlobStore",
    "MemoryBlobs",
    "MemoryCheckpointStore",
    "MemoryJournal",
    "ReceivedRequest",
    "RecordingBatchSink",
    "RecordingHandler",
    "RecordingSink",
    "Reply",
    "Responder",
    "SourceCall",
    "Step",
    "UnknownObjectError",
    "WebhookReceiver",
    "apply_calls",
    "change_event",
    "decode_cloudevents",
    "deliver_all",
    "expired_status",
    "kube_object",
    "object_key_of",
    "running_informer",
    "spin_until",
    "written_events",
    "written_lines",
]
