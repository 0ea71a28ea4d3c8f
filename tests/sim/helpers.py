"""Helpers shared by the simulator's tests: reading a watch stream over raw HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

__all__ = ["read_events", "summary"]


async def read_events(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """Every event line until the server closes the stream."""
    events = []
    async for line in resp.content:
        if line.strip():
            events.append(orjson.loads(line))
    return events


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(type, name or RV) per event."""
    out = []
    for e in events:
        meta = e["object"].get("metadata", {})
        out.append((e["type"], meta.get("name") or meta.get("resourceVersion", "")))
    return out
