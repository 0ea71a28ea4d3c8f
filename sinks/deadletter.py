"""Dead-letter destinations: where events that can never be delivered go, with the reason.

A permanent failure (a 4xx, a message too large, or transient failures past the retry limit) must not
stall the checkpoint forever, and must not vanish either: the sink writes the message and the reason
to its dead-letter destination, then acks the event as ``DEAD_LETTERED``. The file writer here is
built in; the Kafka and NATS sinks provide writers for a topic / subject by implementing
:class:`DeadLetterWriter` (see ``BaseSink._make_dead_letter``).

File records are JSON lines: ``{"time", "sink", "reason", "attempts", "event_id", "key",
"destination", "headers", "message"}`` where ``message`` is the JSON body the sink tried to send
(embedded as JSON), or the body as a string when it is UTF-8 but not JSON. A body that is neither (a
quarantined object's bytes that are not UTF-8, :mod:`sinks.malformed`) has ``message`` null and
``message_base64`` its bytes base64-encoded: a dead letter gives back exactly what it was given. Kafka
and NATS dead letters write the same records (:func:`dead_letter_json`).
"""

from __future__ import annotations

import asyncio
import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from sinks.cloudevents import rfc3339
from sinks.contract import SinkConfigError

__all__ = ["DeadLetterRecord", "DeadLetterWriter", "FileDeadLetter", "dead_letter_json"]


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    sink: str
    reason: str
    attempts: int
    time: float
    event_id: str
    key: bytes
    destination: str
    headers: dict[str, str]
    body: bytes


def _message(body: bytes) -> dict[str, Any]:
    """The record's members for ``body``: ``message`` the body embedded as JSON when it is JSON, as a
    string when it is UTF-8; otherwise ``message`` null and ``message_base64`` the exact bytes."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    else:
        return {"message": orjson.Fragment(body)}
    try:
        return {"message": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"message": None, "message_base64": base64.b64encode(body).decode("ascii")}


def dead_letter_json(record: DeadLetterRecord) -> bytes:
    """The record as one JSON document (module docstring: the body as JSON, a string, or base64)."""
    return orjson.dumps(
        {
            "time": rfc3339(record.time),
            "sink": record.sink,
            "reason": record.reason,
            "attempts": record.attempts,
            "event_id": record.event_id,
            "key": record.key.decode("utf-8", "replace"),
            "destination": record.destination,
            "headers": record.headers,
            **_message(record.body),
        }
    )


class DeadLetterWriter(Protocol):
    async def start(self) -> None:
        """Opens the destination; raises SinkConfigError if it can never work."""

    async def write(self, record: DeadLetterRecord) -> None:
        """Stores the record durably enough to ack the event; raises on failure (the sink retries)."""

    async def close(self) -> None:
        """Idempotent."""


class FileDeadLetter:
    """Appends JSON lines to a file, flushed and fsynced before ``write`` returns."""

    def __init__(self, *, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fh: IO[bytes] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        if self._fh is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab")  # noqa: SIM115, ASYNC230 - opened once, at start
        except OSError as exc:
            raise SinkConfigError(f"cannot open dead-letter file {str(self.path)!r}: {exc}") from exc

    async def write(self, record: DeadLetterRecord) -> None:
        if self._fh is None:
            await self.start()
        fh = self._fh
        assert fh is not None
        line = dead_letter_json(record) + b"\n"
        async with self._lock:
            fh.write(line)
            fh.flush()
            await asyncio.to_thread(os.fsync, fh.fileno())

    async def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()
