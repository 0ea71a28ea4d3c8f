"""Fault injection for the simulator: the failures a reflector must survive, on demand.

A :class:`FaultSpec` is set when the simulator is built (per run) and replaced or amended at run time
through ``POST /_sim/faults``; :class:`FaultState` holds it together with the counters that consume it
(how many error answers are left). Watch faults apply to every watch opened while they are set.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["FaultSpec", "FaultState", "FaultTarget", "InjectedError"]


class FaultTarget(enum.StrEnum):
    """Which requests an injected error status applies to."""

    ANY = "any"
    LIST = "list"
    """List requests (GET on a collection without ``watch``)."""
    WATCH = "watch"


class FaultSpec(BaseModel):
    """What goes wrong, and how often. The default is a healthy server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    watch_close_after: int | None = Field(default=None, ge=0)
    """Close every watch stream cleanly after this many events (bookmarks not counted)."""
    watch_cut_after: int | None = Field(default=None, ge=0)
    """After this many complete events, write the first half of the next line, then close."""
    watch_garble_after: int | None = Field(default=None, ge=0)
    """After this many events, send the next event as a line that is not JSON (its change is not sent
    again on that stream), then carry on: a corrupted line in an otherwise healthy stream. Once per
    watch."""
    watch_expire_after: int | None = Field(default=None, ge=0)
    """After this many events, send an ERROR event with a 410 Expired Status, then close."""
    watch_stall: bool = False
    """Hold every watch stream open and send nothing on it (no event, no bookmark) while set: a watch
    that looks connected but has stopped delivering. The changes made meanwhile go out once it is
    cleared (or on the next watch, after the stream's timeout)."""
    delay: float = Field(default=0.0, ge=0.0, le=600.0)
    """Seconds to wait before answering every API request (admin endpoints excepted)."""
    error_code: int | None = None
    """Answer the next ``error_count`` matching requests with this status (429, 500 or 503)."""
    error_count: int = Field(default=0, ge=0)
    error_retry_after: int = Field(default=1, ge=0)
    """``Retry-After`` seconds (and the Status's ``details.retryAfterSeconds``) of injected errors."""
    error_target: FaultTarget = FaultTarget.ANY
    lease_delay: float = Field(default=0.0, ge=0.0, le=600.0)
    """Seconds to hold every ``coordination.k8s.io`` Lease request before answering it (a hung or
    slow leader election while the rest of the API answers)."""
    lease_delay_user_agent: str = ""
    """Only Lease requests whose ``User-Agent`` contains this text are held ("" = all of them)."""

    @field_validator("error_code")
    @classmethod
    def _known_code(cls, value: int | None) -> int | None:
        if value is not None and value not in (429, 500, 503):
            raise ValueError("error_code must be 429, 500 or 503")
        return value


class InjectedError(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: int
    retry_after: int


class FaultState:
    """The current :class:`FaultSpec` and what is left of its error budget."""

    def __init__(self, spec: FaultSpec | Mapping[str, Any] | None = None) -> None:
        self.spec = FaultSpec()
        self.errors_remaining = 0
        self.injected = 0
        """How many error answers were injected since the start."""
        self.replace(spec or FaultSpec())

    def replace(self, spec: FaultSpec | Mapping[str, Any]) -> FaultSpec:
        """Sets a whole new spec (unset fields back to healthy). Raises ``ValueError`` when invalid."""
        self.spec = _validate(spec)
        self.errors_remaining = self.spec.error_count if self.spec.error_code else 0
        return self.spec

    def amend(self, changes: Mapping[str, Any]) -> FaultSpec:
        """Changes only the given fields; a given ``error_count`` restarts the error budget."""
        merged = {**self.spec.model_dump(), **changes}
        spec = _validate(merged)
        self.spec = spec
        if "error_count" in changes or "error_code" in changes:
            self.errors_remaining = spec.error_count if spec.error_code else 0
        return spec

    def take_error(self, *, is_watch: bool, is_list: bool) -> InjectedError | None:
        """Consumes one injected error if the request matches the spec's target."""
        spec = self.spec
        if spec.error_code is None or self.errors_remaining <= 0:
            return None
        if spec.error_target is FaultTarget.LIST and not is_list:
            return None
        if spec.error_target is FaultTarget.WATCH and not is_watch:
            return None
        self.errors_remaining -= 1
        self.injected += 1
        return InjectedError(code=spec.error_code, retry_after=spec.error_retry_after)

    def lease_delay_for(self, user_agent: str) -> float:
        """Seconds a Lease request from ``user_agent`` is held."""
        spec = self.spec
        if spec.lease_delay <= 0 or spec.lease_delay_user_agent not in user_agent:
            return 0.0
        return spec.lease_delay

    def describe(self) -> dict[str, Any]:
        return {**self.spec.model_dump(mode="json"), "errors_remaining": self.errors_remaining,
                "errors_injected": self.injected}


def _validate(spec: FaultSpec | Mapping[str, Any]) -> FaultSpec:
    if isinstance(spec, FaultSpec):
        return spec
    try:
        return FaultSpec.model_validate(dict(spec))
    except ValidationError as exc:
        raise ValueError(f"invalid fault spec: {exc}") from exc
