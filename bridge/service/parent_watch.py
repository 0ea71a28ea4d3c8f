"""A worker's watch on its supervisor: a worker whose supervisor is gone (killed without a chance to
stop it) stops too, so that none is left behind holding the spill root's lock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

log = logging.getLogger("bridge.service.workers")


def watch_parent(stop: asyncio.Event, *, every: float = 1.0) -> asyncio.Task[None]:
    """In a worker: sets ``stop`` when the supervisor that started it is gone, so that one killed
    without stopping its workers leaves none behind (nor its spill root locked by them): at its exit
    (a pidfd, Linux 5.3+), elsewhere when a poll every ``every`` seconds sees the parent changed."""
    parent = os.getppid()

    def gone(exited: bool = False) -> bool:
        if not exited and os.getppid() == parent:
            return False
        if not stop.is_set():
            log.error("the supervisor (pid %d) is gone: stopping", parent)
            stop.set()
        return True

    async def watch() -> None:
        try:
            pidfd = os.pidfd_open(parent)
        except (AttributeError, OSError):
            pidfd = None
        while pidfd is None and not stop.is_set() and not gone():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
        if pidfd is None:
            return
        loop = asyncio.get_running_loop()
        loop.add_reader(pidfd, gone, True)  # readable once the supervisor has exited
        try:
            gone()  # (it may have exited before the pidfd was opened)
            await stop.wait()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    return asyncio.create_task(watch(), name="watch-supervisor")
