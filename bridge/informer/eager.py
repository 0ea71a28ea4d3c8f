"""Running a coroutine at once in the caller's task, and on in a task of its own only if it waits.

The informer's fast path hands an idle listener's batch to its handler in the informer's own task
(:meth:`~bridge.informer.listener.ProcessorListener.deliver_deferred`) when the handler said it would
not wait. :func:`run_eagerly` runs the call's coroutine up to its first suspension right there: the
common case ends without one, with no task, no wake-up and no turn of the event loop. Should it wait
after all, the caller is not held: the coroutine carries on in a task of its own from where it
waits, exactly as if that task had run it from the start (what Python 3.12's eager tasks do; this
project supports 3.11). The caller then makes whatever comes next wait for that task.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["run_eagerly"]


def run_eagerly(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
    """Runs ``coro`` until it ends or first waits: None when it ended (what it raised propagates),
    else the task it carries on in."""
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_carry_on(coro, waiting_on), name=name)


async def _carry_on(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    await _resume(coro, waiting_on)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> Generator[Any, Any, None]:
    """Hands what ``coro`` waits on to the running task, as ``coro`` itself would have (a future, or
    None for a bare turn of the loop), and passes what the task sends or throws back into it."""
    while True:
        try:
            sent = yield waiting_on
        except BaseException as exc:  # the task was cancelled (or a future failed into it)
            try:
                waiting_on = coro.throw(exc)
            except StopIteration:
                return
            continue
        try:
            waiting_on = coro.send(sent)
        except StopIteration:
            return
