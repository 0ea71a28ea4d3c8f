"""Exceptions raised by the Kubernetes API boundary and the bridge's configuration.

The tree is drawn here so that the reflector can apply client-go's policy by type (410 → relist,
"too large resource version" → relist with a consistent read, 429 → back off and retry) without knowing
the transport. Transport errors (aiohttp, the ``kubernetes`` package) are mapped to these at the edge,
with ``raise … from`` keeping the cause. Messages never include credentials.

    BridgeError
    ├── ConfigurationError            bad configuration or kubeconfig; fix the input
    ├── DecodeError                   bytes from outside that are not what they must be (JSON, a
    │                                 watch event, an object …): the only error a decode raises
    └── ApiError                      anything the API server (or the way to it) answered
        ├── ApiUnavailableError       connection refused / reset / timed out; retry with backoff
        └── ApiStatusError            an HTTP status with a Kubernetes Status body
            ├── ResourceExpiredError          410 Gone / reason Expired: relist
            ├── TooLargeResourceVersionError  504 "Too large resource version": relist consistently
            ├── TooManyRequestsError          429: honour retry_after
            ├── ServerError                   5xx: honour retry_after when present
            ├── NotFoundError                 404: the resource (or object) does not exist
            ├── ForbiddenError                403: RBAC forbids it
            ├── UnauthorizedError             401: credentials missing or rejected
            ├── ConflictError                 409
            └── BadRequestError               other 4xx
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApiError",
    "ApiStatusError",
    "ApiUnavailableError",
    "BadRequestError",
    "BridgeError",
    "ConfigurationError",
    "ConflictError",
    "DecodeError",
    "ForbiddenError",
    "NotFoundError",
    "ResourceExpiredError",
    "ServerError",
    "TooLargeResourceVersionError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "status_error",
]


class BridgeError(Exception):
    """Base of every error the bridge raises on purpose."""


class ConfigurationError(BridgeError):
    """The configuration (or a kubeconfig) is invalid. The message names the field and the fix."""


class DecodeError(BridgeError, ValueError):
    """Bytes from the API server (or another outside source) that cannot be decoded as what they
    must be. Every decoder of outside input raises this (or a subclass) and nothing else; an object
    beyond the decoders' bounds is not an error but quarantined (:mod:`bridge.kube.bounded`)."""


class ApiError(BridgeError):
    """The API server could not serve a request."""


class ApiUnavailableError(ApiError):
    """The server could not be reached, or the connection broke."""


class ApiStatusError(ApiError):
    """The server answered with an error status, usually carrying a ``Status`` object."""

    def __init__(
        self,
        message: str,
        *,
        code: int,
        reason: str = "",
        retry_after: float | None = None,
        status: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.retry_after = retry_after
        self.status = status or {}


class ResourceExpiredError(ApiStatusError):
    """410: the requested resourceVersion or continue token is older than the server's history."""


class TooLargeResourceVersionError(ApiStatusError):
    """The requested resourceVersion is newer than the server has seen."""


class TooManyRequestsError(ApiStatusError):
    """429: slow down; ``retry_after`` says for how long."""


class ServerError(ApiStatusError):
    """5xx other than "too large resource version"."""


class NotFoundError(ApiStatusError):
    """404."""


class ForbiddenError(ApiStatusError):
    """403: RBAC forbids the request."""


class UnauthorizedError(ApiStatusError):
    """401."""


class ConflictError(ApiStatusError):
    """409."""


class BadRequestError(ApiStatusError):
    """Any other 4xx."""


def _is_too_large_rv(message: str) -> bool:
    return "too large resource version" in message.lower()


def status_error(
    code: int,
    status: dict[str, Any] | None = None,
    *,
    retry_after: float | None = None,
    context: str = "",
) -> ApiStatusError:
    """Maps an HTTP status code and its ``Status`` body to the matching exception.

    ``context`` (e.g. ``"list pods"``) is prefixed to the message so errors name what failed.
    """
    status = status or {}
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or f"HTTP {code}")
    if retry_after is None:
        details = status.get("details") or {}
        if isinstance(details, dict) and details.get("retryAfterSeconds") is not None:
            retry_after = float(details["retryAfterSeconds"])
    text = f"{context}: {message}" if context else message
    kwargs: dict[str, Any] = {"code": code, "reason": reason, "retry_after": retry_after, "status": status}
    cls: type[ApiStatusError]
    if code == 410 or reason in ("Expired", "Gone"):
        cls = ResourceExpiredError
    elif _is_too_large_rv(message):
        cls = TooLargeResourceVersionError
    elif code == 429:
        cls = TooManyRequestsError
    elif code >= 500:
        cls = ServerError
    elif code == 404:
        cls = NotFoundError
    elif code == 403:
        cls = ForbiddenError
    elif code == 401:
        cls = UnauthorizedError
    elif code == 409:
        cls = ConflictError
    else:
        cls = BadRequestError
    return cls(text, **kwargs)
