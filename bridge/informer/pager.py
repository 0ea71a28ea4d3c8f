"""One whole list of a scope, page by page: client-go's ``tools/pager`` for a caller outside the reflector."""

from __future__ import annotations

from bridge.contracts import KubeObject, ListerWatcher, ListOptions, TransformFunc
from bridge.errors import ResourceExpiredError

__all__ = ["list_all"]


async def list_all(lister_watcher: ListerWatcher, *, page_size: int,
                   transform: TransformFunc | None = None) -> tuple[list[KubeObject], str]:
    """Lists everything now (a consistent read, in pages of ``page_size``; 0: unpaginated), each
    object passed through ``transform``; returns the objects and the list's resourceVersion. An
    expired continuation is retried once as one unpaginated list, as the reflector does."""
    items: list[KubeObject] = []
    options = ListOptions(limit=page_size or None)
    list_rv = ""
    while True:
        try:
            page = await lister_watcher.list(options)
        except ResourceExpiredError:
            if options.continue_token is None:
                raise
            page = await lister_watcher.list(ListOptions())
            items = []
            list_rv = ""
        items.extend(page.items if transform is None else map(transform, page.items))
        list_rv = list_rv or page.resource_version
        if not page.continue_token:
            return items, list_rv
        options = ListOptions(limit=options.limit, continue_token=page.continue_token)
