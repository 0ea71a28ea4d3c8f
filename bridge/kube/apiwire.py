"""The HTTP details of the Kubernetes API that the client and its streams share: query parameters,
``Retry-After``, ``Status`` bodies of error answers, the JSON object of a 2xx answer, URLs as
messages show them, and which transport errors mean the server could not be reached."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from bridge.errors import ApiStatusError
from bridge.jsonbounds import MAX_DEPTH, exceeds_depth

__all__ = ["RETRYABLE_NETWORK_ERRORS", "Params", "encode_params", "json_object", "parse_retry_after",
           "redact_url", "status_body"]

Params = Mapping[str, str | int | bool | None]
"""Query parameters; ``None`` values are left out, booleans sent as ``true``/``false``."""

RETRYABLE_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def redact_url(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return url


def encode_params(params: Params | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        else:
            out[key] = str(value)
    return out


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None when absent/invalid."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(int(value)))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def status_body(body: bytes, code: int) -> dict[str, Any]:
    """The ``Status`` object of an error answer, or a synthetic one for a non-JSON body."""
    try:
        decoded = orjson.loads(body) if body and not exceeds_depth(body, MAX_DEPTH) else None
    except orjson.JSONDecodeError:
        decoded = None
    if isinstance(decoded, dict) and (decoded.get("kind") == "Status" or "message" in decoded):
        return decoded
    text = body[:200].decode("utf-8", "replace").strip()
    return {"kind": "Status", "status": "Failure", "code": code, "message": text or f"HTTP {code}"}


def json_object(raw: bytes, context: str) -> dict[str, Any]:
    """The JSON object of a 2xx answer's body ({} for an empty one); anything else is an error."""
    if not raw.strip():
        return {}
    if exceeds_depth(raw, MAX_DEPTH):  # what passes the decoder must encode again (orjson: 254)
        raise ApiStatusError(f"{context}: the server answered JSON nested deeper than {MAX_DEPTH} levels",
                             code=200)
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiStatusError(f"{context}: the server answered invalid JSON", code=200) from e
    if not isinstance(decoded, dict):
        raise ApiStatusError(f"{context}: expected a JSON object, got {type(decoded).__name__}", code=200)
    return decoded
