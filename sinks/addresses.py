"""Checks of broker addresses, at configuration time.

A malformed address (``http//nats:4222``, ``kafka:90 92``) would otherwise pass validation and leave
the sink retrying a connection that can never work, the bridge unready for good. These checks accept
what the client libraries accept and reject the rest with a message naming the address.
"""

from __future__ import annotations

import urllib.parse

__all__ = ["NATS_SCHEMES", "check_kafka_brokers", "check_nats_url"]

NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def _host_port(parts: urllib.parse.SplitResult, shown: str, *, need_port: bool) -> None:
    if not parts.hostname:
        raise ValueError(f"{shown!r} has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{shown!r} has a bad port (a number from 1 to 65535)") from None
    if need_port and port is None:
        raise ValueError(f"{shown!r} has no port (host:port)")
    if port == 0:
        raise ValueError(f"{shown!r} has a bad port (a number from 1 to 65535)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        extra = parts.path or parts.query or parts.fragment
        raise ValueError(f"{shown!r} is not host:port (unexpected {extra!r})")


def _shown(url: str) -> str:
    """``url`` without its user info (which may hold a password or token)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def check_nats_url(url: str) -> str:
    """A NATS server URL: ``nats://host[:port]``, ``tls://…``, ``ws://…``, ``wss://…``, or a bare
    ``host[:port]`` (nats-py reads it as ``nats://``). Raises ValueError naming what is wrong."""
    shown = _shown(url)
    if not url or url != url.strip() or any(c.isspace() for c in url):
        raise ValueError(f"{shown!r} is not a NATS URL (nats://host:port)")
    text = url if "://" in url else f"nats://{url}"
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in NATS_SCHEMES:
        raise ValueError(f"{shown!r} is not a NATS URL: the scheme must be one of "
                         f"{', '.join(s + '://' for s in NATS_SCHEMES)}")
    try:
        _host_port(parts, shown, need_port=False)
    except ValueError as exc:
        raise ValueError(f"{exc} (a NATS URL is nats://host:port)") from None
    return url


def check_kafka_brokers(text: str) -> str:
    """``bootstrap.servers``: a comma-separated list of ``host:port`` (each optionally prefixed by a
    listener scheme such as ``PLAINTEXT://`` or ``SSL://``). Raises ValueError naming the bad entry."""
    entries = [e.strip() for e in text.split(",")]
    if not any(entries):
        raise ValueError("no broker given (host:port[,host:port…])")
    for entry in entries:
        if not entry or any(c.isspace() for c in entry):
            raise ValueError(f"{text!r} is not a list of host:port (an empty or blank entry)")
        url = entry if "://" in entry else f"kafka://{entry}"
        try:
            _host_port(urllib.parse.urlsplit(url), entry, need_port=True)
        except ValueError as exc:
            raise ValueError(f"broker {exc}") from None
    return text
