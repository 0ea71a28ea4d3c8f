"""Reading an HTTP answer's body from a peer the bridge does not control: never more than a bound.

A receiver or a server may answer with a body of any size, slowly or without end (an endless
chunked reply). Whatever the bridge does with an answer's body (the start of an error message, a
``Status`` object), it reads at most a bounded prefix; when the body is longer, the connection is
closed rather than drained, so that the rest is never read and the connection is not reused.
"""

from __future__ import annotations

import aiohttp

__all__ = ["ERROR_BODY_LIMIT", "drain_buffered", "read_prefix"]

ERROR_BODY_LIMIT = 64 * 1024
"""What is read of an error answer: enough for any Kubernetes ``Status`` or a receiver's message."""


async def read_prefix(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of ``response``'s body, and whether the body was longer (then the
    connection is closed: what remains is never read). Waits for data as the body arrives: the
    request's timeout bounds a slow body."""
    buf = bytearray()
    content = response.content
    while len(buf) < limit:
        chunk = await content.read(limit - len(buf))
        if not chunk:
            return bytes(buf), False
        buf += chunk
    if content.at_eof():
        return bytes(buf), False
    response.close()
    return bytes(buf), True


def drain_buffered(response: aiohttp.ClientResponse, limit: int) -> bool:
    """Consumes the part of the body already received (at most ``limit`` bytes) without waiting;
    True when that was the whole body (the connection can be reused), else the connection is closed.
    For answers whose body does not matter (a receiver's 2xx): the status is the outcome."""
    content = response.content
    taken = 0
    try:
        while taken < limit and not content.at_eof():
            chunk = content.read_nowait(limit - taken)
            if not chunk:
                break
            taken += len(chunk)
    except (aiohttp.ClientError, ConnectionError):  # the body broke off: the status stands
        response.close()
        return False
    if content.at_eof():
        return True
    response.close()
    return False
