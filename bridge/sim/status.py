"""Errors of the simulator, rendered as the ``Status`` objects kube-apiserver sends.

Every failure the store or the HTTP layer produces is a :class:`SimStatusError`; the server turns it into
an HTTP response whose code and body match what a real API server would answer, so that clients
(the official ``kubernetes`` package, the bridge's own client) see the real contract.

    SimStatusError                 code, reason, message, details → Status
    ├── NotFound                   404 NotFound
    ├── AlreadyExists              409 AlreadyExists
    ├── Conflict                   409 Conflict (stale resourceVersion)
    ├── Invalid                    422 Invalid
    ├── BadRequest                 400 BadRequest
    │   └── UnsupportedMediaType   415 UnsupportedMediaType
    ├── Expired                    410 Expired (too old resourceVersion / continue token)
    └── TooLargeResourceVersion    504 Timeout, "Too large resource version", Retry-After 1
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyExists",
    "BadRequest",
    "Conflict",
    "Expired",
    "Invalid",
    "NotFound",
    "SimStatusError",
    "TooLargeResourceVersion",
    "UnsupportedMediaType",
    "make_status",
]


def make_status(
    *,
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
    continue_token: str | None = None,
) -> dict[str, Any]:
    """A failure ``Status`` object as kube-apiserver encodes it."""
    metadata: dict[str, Any] = {}
    if continue_token is not None:
        metadata["continue"] = continue_token
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": metadata,
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    return status


class SimStatusError(Exception):
    """A request failed; :meth:`status` is the body to send and :attr:`code` the HTTP status."""

    code: int = 500
    reason: str = "InternalError"

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after: int | None = None,
        continue_token: str | None = None,
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})
        self.retry_after = retry_after
        self.continue_token = continue_token
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason
        if retry_after is not None:
            self.details.setdefault("retryAfterSeconds", retry_after)

    def status(self) -> dict[str, Any]:
        return make_status(
            code=self.code,
            reason=self.reason,
            message=self.message,
            details=self.details,
            continue_token=self.continue_token,
        )


def _object_details(name: str, kind: str, group: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


class NotFound(SimStatusError):
    code = 404
    reason = "NotFound"

    @classmethod
    def object(cls, *, plural: str, group: str, name: str) -> NotFound:
        qualified = f"{plural}.{group}" if group else plural
        return cls(f'{qualified} "{name}" not found', details=_object_details(name, plural, group))


class AlreadyExists(SimStatusError):
    code = 409
    reason = "AlreadyExists"

    @classmethod
    def object(cls, *, plural: str, group: str, name: str) -> AlreadyExists:
        qualified = f"{plural}.{group}" if group else plural
        return cls(f'{qualified} "{name}" already exists', details=_object_details(name, plural, group))


class Conflict(SimStatusError):
    code = 409
    reason = "Conflict"

    @classmethod
    def stale(cls, *, plural: str, group: str, name: str) -> Conflict:
        qualified = f"{plural}.{group}" if group else plural
        return cls(
            f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            details=_object_details(name, plural, group),
        )


class Invalid(SimStatusError):
    code = 422
    reason = "Invalid"


class BadRequest(SimStatusError):
    code = 400
    reason = "BadRequest"


class UnsupportedMediaType(BadRequest):
    code = 415
    reason = "UnsupportedMediaType"


class Expired(SimStatusError):
    code = 410
    reason = "Expired"


class TooLargeResourceVersion(SimStatusError):
    code = 504
    reason = "Timeout"

    @classmethod
    def for_rv(cls, requested: int, current: int) -> TooLargeResourceVersion:
        return cls(
            f"Timeout: Too large resource version: {requested}, current: {current}",
            details={"causes": [{"reason": "ResourceVersionTooLarge",
                                 "message": "Too large resource version"}]},
            retry_after=1,
        )
