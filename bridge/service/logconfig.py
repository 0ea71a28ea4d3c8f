"""Structured logging: one JSON object per line (or readable text for a terminal), with levels.

Every record carries ``time``, ``level``, ``logger`` and ``message``; keyword context given through
``extra={...}`` appears as top-level fields. Nothing here ever formats credentials: callers pass
resource names, sink names and counts, never tokens.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields: what callers passed with ``extra={...}``."""
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """Readable lines for a terminal: the message, then the structured fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return head + " " + " ".join(f"{k}={v}" for k, v in fields.items()) + sep + tail


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update(_fields(record))
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(payload, default=str).decode()


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Installs one handler on the root logger (replacing earlier ones) at ``level``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = TextFormatter()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Client libraries are chatty at debug; keep them at warning unless asked for.
    for noisy in ("aiohttp.access", "kafka", "nats", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
