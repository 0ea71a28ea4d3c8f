"""What a caller tunes and observes of :class:`~bridge.kube.apiclient.ApiClient`: its options
(timeouts, retries, the rate limit, connection pool) and the observer told of every retried answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bridge.kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS
from bridge.version import __version__

__all__ = ["ApiClientOptions", "RetryObserver"]


class RetryObserver(Protocol):
    """Told about the answers :meth:`ApiClient._send` waits out and sends again (429/5xx with
    Retry-After), so that a caller can report a wait nobody would otherwise see (a resourceVersion
    ahead of the server: ten retries of ~4 s before the reflector sees the 504)."""

    def retrying(self, context: str, code: int, message: str, *, attempt: int, max_retries: int,
                 wait: float, attempt_seconds: float) -> None:
        """Answer ``code`` (its Status ``message``) took ``attempt_seconds``; retry ``attempt`` of
        ``max_retries`` follows after ``wait`` seconds. Must not raise or block."""

    def settled(self, context: str, error: BaseException | None) -> None:
        """A call that was retried at least once ended: a 2xx answer (None) or ``error``."""


@dataclass(frozen=True, slots=True)
class ApiClientOptions:
    """Tuning of the HTTP client. Defaults follow client-go where it has one."""

    max_retries: int = 10
    """429/5xx answers carrying Retry-After are retried this many times (client-go: 10)."""
    max_retry_after: float = 60.0
    """A longer Retry-After is waited only this long."""
    request_timeout: float = 60.0
    """Whole-request timeout for non-streaming requests (seconds)."""
    connect_timeout: float = 10.0
    stream_idle_timeout: float | None = None
    """A watch with no byte for this long is treated as dropped. None: rely on ``timeoutSeconds``
    (the watch read timeout is then ``timeoutSeconds`` + 30 s)."""
    max_line_bytes: int = 64 * 1024 * 1024
    """A watch line longer than this is discarded (and the stream ends): a protection, not a limit
    any real object reaches (etcd caps objects at ~1.5 MiB)."""
    connection_limit: int = 100
    """Connections for requests (lists, GETs, writes). Watches are not counted: each holds its own
    connection for as long as it streams, as many as there are informers (client-go's transport
    does not bound connections per host either); sharing one bounded pool, a bridge with more
    informers than this limit had every connection held by a watch and its lists timed out."""
    token_refresh_interval: float = 60.0
    """In-cluster: the token file is re-read at most this often (and at once after a 401)."""
    user_agent: str = f"kube-event-bridge/{__version__}"
    qps: float = DEFAULT_QPS
    """Client-side rate limit, requests a second (client-go's ``QPS``); negative: no limit."""
    burst: int = DEFAULT_BURST
    """Requests the rate limit lets through at once (client-go's ``Burst``)."""
