"""Blocking store writes run in a thread, and never abandoned half-way.

The file checkpoint store and the file journal write with blocking calls (write, ``fsync``,
``rename``) in a worker thread. :func:`asyncio.to_thread` hands its caller the cancellation at once
while the thread goes on, so a write cancelled mid-way would land *after* its owner stopped: the
pipeline's abort (:meth:`~bridge.delivery.pipeline.BridgePipeline.abort`, when leadership is lost)
cancels the checkpoint writer and the journal's writer. If the same process then starts a pipeline
again (it leads again), that late write replaces what the new pipeline wrote since: the journal it
made durable before releasing new objects to the sinks, or a newer checkpoint. The lost records are
objects the sinks hold that no store knows any more, so after the next crash nobody sends their
deletes.

**Invariant**: a store write started by a task is finished (landed or failed) when that task ends,
cancelled or not. :func:`finish_in_thread` keeps it: a cancellation takes effect once the thread is
done, which delays an abort by at most one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["finish_in_thread"]

P = ParamSpec("P")
T = TypeVar("T")


async def finish_in_thread(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Runs ``func`` in a thread as :func:`asyncio.to_thread` does, but a cancellation of the caller
    waits for the thread to finish before it is raised (however often it is repeated meanwhile);
    the thread's result or error is then dropped."""
    work = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():
            try:
                await asyncio.wait((work,))
            except asyncio.CancelledError:
                continue  # cancelled again: the write still has to finish first
        if not work.cancelled():
            work.exception()  # retrieved: the caller is cancelled, it wants neither result nor error
        raise
