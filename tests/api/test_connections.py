"""Watches do not starve the API client's requests of connections.

Each watch holds one HTTP/1.1 connection for as long as it streams. The client's pool was bounded
(``connection_limit``, 100) for every request alike, so a bridge running more informers than that
(5 resources in 1,000 namespaces: 5,000 watches) had every connection held by a watch and its next
list waited for a free one until it timed out: informers beyond the first hundred never synced.
client-go's transport does not bound connections per host (``MaxConnsPerHost`` 0) for this reason.
"""

from __future__ import annotations

import asyncio

from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.sim import Simulator


async def test_lists_still_go_out_while_watches_hold_more_connections_than_the_limit() -> None:
    async with Simulator() as sim:
        options = ApiClientOptions(connection_limit=2, request_timeout=5.0)
        async with ApiClient(server=sim.url, options=options) as client:
            streams = [await asyncio.wait_for(
                client.open_stream("/api/v1/namespaces/default/configmaps",
                                   {"watch": True, "timeoutSeconds": 30}), 5.0)
                for _ in range(4)]
            try:
                listed = await asyncio.wait_for(client.get("/api/v1/namespaces/default/configmaps"), 5.0)
                assert listed["kind"] == "ConfigMapList"
                # Requests share the bounded pool among themselves.
                answers = await asyncio.gather(*(client.get("/api/v1/namespaces/default/pods")
                                                 for _ in range(6)))
                assert all(a["kind"] == "PodList" for a in answers)
            finally:
                for s in streams:
                    await s.close()
