"""A paginated List that never ends, through the lister-watcher over real HTTP: a server answering a
new continue token on every page, with or without a ``remainingItemCount``, makes the list fail after
a bounded number of pages with an error naming it, rather than page forever."""

from __future__ import annotations

import pytest

from bridge.contracts import ListOptions
from bridge.errors import ApiStatusError
from bridge.kube.apiclient import ApiClient
from bridge.kube.discovery import APIResource
from bridge.kube.listwatch import HttpListerWatcher

from .apiserver import HostileApiServer, obj

PODS = APIResource(group="", version="v1", resource="pods", kind="Pod", namespaced=True,
                   verbs=("list", "watch"))


async def _page_until_refused(lw: HttpListerWatcher, limit: int) -> tuple[int, ApiStatusError]:
    """Pages as the reflector's pager does (every token is new, so its repeat check never fires)."""
    options = ListOptions(resource_version="0", limit=limit)
    pages = 0
    while True:
        try:
            page = await lw.list(options)
        except ApiStatusError as e:
            return pages, e
        pages += 1
        assert page.continue_token, "the scripted List always continues"
        assert pages < 10_000, "never refused"
        options = ListOptions(limit=limit, continue_token=page.continue_token)


@pytest.mark.parametrize("remaining", [None, 3])
async def test_a_list_whose_new_continue_tokens_never_end_is_refused_after_a_bounded_number_of_pages(
    server: HostileApiServer, remaining: int | None
) -> None:
    pods = server.resources["pods"]
    pods.items = [obj("Pod", "p", 1)]
    pods.endless_continue = pods.changing_continue = True
    pods.remaining_item_count = remaining
    async with ApiClient(server=server.url) as client:
        lw = HttpListerWatcher(client=client, resource=PODS, max_list_pages=40)
        pages, error = await _page_until_refused(lw, limit=5)
        # Announced: 1 item and 3 more; refused once more than 2 * 4 + a page of 5 were read.
        assert pages == (40 if remaining is None else 13)
        assert "a paginated list that does not end" in str(error)
        assert error.reason == "EndlessList"
        # Listing again starts a new list, refused the same way (no state left behind).
        again, _ = await _page_until_refused(lw, limit=5)
        assert again == pages
    assert len(pods.list_runs) == 2
