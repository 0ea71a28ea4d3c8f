"""Telling a selector exit from a delete (docs/event-format.md, "Selector exits").

A watch scoped by a label or field selector reports an object that stops matching as ``DELETED``,
exactly like a real delete; only the API server can tell them apart (an exited uid outlives that
resourceVersion). :class:`SelectorExits` asks it once per change, whatever the number of sinks, and the sink
listeners mark exits with the ``leftselector`` extension. An unanswered question sends a plain
delete: the safe reading, and nothing waits on it. After a restart, what a replay of a uid whose
inferred delete was sent may send depends on whether the uid lives on, which :meth:`SelectorExits.alive`
asks once per uid (docs/delivery-contract.md, section 6).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from bridge.errors import BridgeError, NotFoundError
from bridge.resource_version import parse_rv
from sinks.contract import ChangeEvent, EventType

__all__ = ["LEFT_SELECTOR_EXTENSION", "SelectorExits", "mark_exits"]

log = logging.getLogger(__name__)

LEFT_SELECTOR_EXTENSION: Final = "leftselector"
"""Set to ``"true"`` on a ``deleted`` event whose object left the selector and still exists."""

_UNANSWERED: Final = -1
"""What :meth:`SelectorExits._look` returns when the API server could not tell (a resourceVersion
is never negative)."""

Fetch = Callable[[str, str, str], Awaitable[Mapping[str, Any]]]
"""``fetch(namespace, name, at)``: the object unfiltered, now (``at`` empty) or at exactly resourceVersion
``at``; raises :class:`~bridge.errors.NotFoundError` when it does not (did not) exist."""


class SelectorExits:
    """Answers "did this deleted object leave the selector?" for one selector-scoped informer."""

    def __init__(self, *, fetch: Fetch, timeout: float = 5.0, memory: int = 1024, attempts: int = 5,
                 retry_delay: float = 1.0) -> None:
        """``attempts`` and ``retry_delay`` (seconds) bound how long :meth:`alive` retries a question
        the API server cannot answer."""
        self._fetch, self._timeout, self._memory = fetch, timeout, memory
        self._attempts = max(1, attempts)
        self._retry_delay = retry_delay
        self._answers: OrderedDict[tuple[str, str], asyncio.Future[int | None]] = OrderedDict()
        """(uid, resourceVersion) of a delete → what :meth:`_look` found, shared by every sink's listener."""
        self._alive: OrderedDict[str, asyncio.Future[int | None]] = OrderedDict()
        """uid → :meth:`alive`'s answer, shared by every sink's listener."""

    async def alive(self, namespace: str, name: str, uid: str) -> int | None:
        """The resourceVersion ``uid`` has now when it still exists, None when it is gone (not
        found, or the name holds another uid). Asked once per uid, whatever the number of sinks,
        so that every sink's listener reads the replayed history of that uid alike. A question the
        API server cannot answer is retried (``attempts`` times, ``retry_delay`` apart), then read
        as gone, with a warning: for a replayed history that is the reading that never brings a
        deleted uid back (what it costs is stated where it is used)."""
        while True:  # an asker cancelled before the answer: the others ask again
            answer = await self._shared(self._alive, uid, lambda: self._alive_now(namespace, name, uid))
            if not answer.cancelled():
                return answer.result()

    async def left(self, namespace: str, name: str, uid: str, rv: str, inferred: bool = False) -> bool:
        """True when the object ``uid`` outlived its delete at ``rv`` (a selector exit): it exists now
        or, gone since, it existed at ``rv`` (not asked of a delete a relist ``inferred``: ``rv`` is its
        last state's). Unanswered, or its asker cancelled: False (a plain delete)."""
        at = "" if inferred else rv
        answer = await self._shared(self._answers, (uid, rv), lambda: self._look(namespace, name, uid, at))
        return not answer.cancelled() and answer.result() not in (None, _UNANSWERED)

    async def _shared(self, answers: OrderedDict[Any, asyncio.Future[int | None]], key: Any,
                      ask: Callable[[], Awaitable[int | None]]) -> asyncio.Future[int | None]:
        """The answer to ``key``, done: asked by its first caller, shared with the others (the
        ``memory`` newest are kept). Cancelled, and forgotten, when its asker was cancelled first."""
        answer = answers.get(key)
        if answer is not None:
            await asyncio.wait([answer])  # raises only when this caller is cancelled
            return answer
        answer = asyncio.get_running_loop().create_future()
        answers[key] = answer
        while len(answers) > self._memory:
            answers.popitem(last=False)
        try:
            answer.set_result(await ask())
        finally:
            if not answer.done():
                answers.pop(key, None)
                answer.cancel()
        return answer

    async def _alive_now(self, namespace: str, name: str, uid: str) -> int | None:
        for attempt in range(self._attempts):
            if attempt:
                await asyncio.sleep(self._retry_delay)
            answer = await self._look(namespace, name, uid)
            if answer != _UNANSWERED:
                return answer
        log.warning("cannot tell whether %s/%s (uid %s) still exists after %d attempts: its replayed "
                    "changes are read as those of a deleted object", namespace, name, uid, self._attempts)
        return None

    async def _look(self, namespace: str, name: str, uid: str, at: str = "") -> int | None:
        """The resourceVersion ``uid`` has now (0 when not numeric), else (not found, or the name holds
        another uid) the one it had at resourceVersion ``at`` when given; None when it is gone;
        :data:`_UNANSWERED` when the API server could not tell (logged)."""
        for when in ("", at) if at else ("",):
            try:
                async with asyncio.timeout(self._timeout):
                    current = await self._fetch(namespace, name, when)
            except NotFoundError:
                continue
            except (BridgeError, TimeoutError, OSError) as e:
                log.debug("cannot tell whether %s/%s (uid %s) exists at %s: %s", namespace, name, uid,
                          when or "present", e)
                return _UNANSWERED
            except Exception:  # never let the question hold back or break a delivery
                log.warning("cannot tell whether %s/%s (uid %s) exists", namespace, name, uid, exc_info=True)
                return _UNANSWERED
            meta = current.get("metadata")
            if isinstance(meta, Mapping) and meta.get("uid") == uid:
                return parse_rv(str(meta.get("resourceVersion") or "")) or 0
        return None


async def mark_exits(events: Sequence[ChangeEvent], exits: SelectorExits,
                     replayed: Callable[[str, str], bool | None] | None = None) -> None:
    """Marks the deletes among ``events`` whose object still exists: they left the informer's
    selector. A delete a relist inferred is asked too (the object is not listed: alive, it is out of
    scope). ``replayed`` (the sink's replay stage's ``replayed_exit``) answers for a replayed uid
    whose fate it asked."""
    for event in events:
        if event.type is not EventType.DELETED or event.obj is None:
            continue
        uid, rv = event.uid, event.resource_version
        decided = replayed(uid, rv) if replayed is not None else None
        if decided is None:
            decided = await exits.left(event.namespace, event.name, uid, rv, event.final_state_unknown)
        if decided:
            event.extensions[LEFT_SELECTOR_EXTENSION] = "true"
