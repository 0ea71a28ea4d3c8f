"""Test helpers shipped with the package: fakes of the bridge's contracts that record what happened.

They live in the package (not under ``tests/``) so that every test module, the benchmarks and
third-party sink authors can drive an informer without a real API server.
"""

from __future__ import annotations

from bridge.testing.fake_source import (
    INITIAL_EVENTS_END_ANNOTATION,
    FakeControllerSource,
    FakeWatchStream,
    SourceCall,
    expired_status,
    object_key_of,
)
from bridge.testing.recorder import Call, RecordingHandler, UnknownObjectError, apply_calls

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "Call",
    "FakeControllerSource",
    "FakeWatchStream",
    "RecordingHandler",
    "SourceCall",
    "UnknownObjectError",
    "apply_calls",
    "expired_status",
    "object_key_of",
]
