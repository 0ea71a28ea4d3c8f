"""The error mapping at the API boundary and the injectable clock."""

from __future__ import annotations

import asyncio

import pytest

from bridge.clock import FakeClock
from bridge.errors import (
    BadRequestError,
    ForbiddenError,
    NotFoundError,
    ResourceExpiredError,
    ServerError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
    status_error,
)


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        (410, {"reason": "Expired", "message": "too old resource version: 1 (5)"}, ResourceExpiredError),
        (410, {}, ResourceExpiredError),
        (504, {"reason": "Timeout", "message": "Too large resource version: 99, current: 5"},
         TooLargeResourceVersionError),
        (429, {"details": {"retryAfterSeconds": 3}}, TooManyRequestsError),
        (503, {}, ServerError),
        (404, {"reason": "NotFound"}, NotFoundError),
        (403, {"reason": "Forbidden"}, ForbiddenError),
        (422, {"reason": "Invalid"}, BadRequestError),
    ],
)
def test_status_error_maps_codes(code: int, status: dict[str, object], expected: type[Exception]) -> None:
    err = status_error(code, status, context="list pods")
    assert type(err) is expected
    assert str(err).startswith("list pods: ")
    assert err.code == code


def test_retry_after_read_from_status_details() -> None:
    err = status_error(429, {"details": {"retryAfterSeconds": 3}})
    assert err.retry_after == 3.0
    assert status_error(429, {}, retry_after=7).retry_after == 7


async def test_fake_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    plan = (("b", 2), ("a", 1), ("c", 3))
    tasks = [asyncio.create_task(sleeper(n, s), name=f"sleeper-{n}") for n, s in plan]
    await asyncio.sleep(0)
    await clock.advance(1.5)
    assert woke == ["a"]
    await clock.advance(10)
    assert woke == ["a", "b", "c"]
    await asyncio.gather(*tasks)
