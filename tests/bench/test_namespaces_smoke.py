"""Smoke test of the many-namespaces start (bench/bench_namespaces.py) at a CI size: 12 namespaces x
5 resources, the bridge and the simulator as processes, a simulated API server with one seat and a
queue of 2 for the bridge's flow, each request taking 50 ms. Sent at once, the 60 lists meet 429s;
paced by the client-side limit (5 a second after a burst of 2), none does, and both starts sync
every informer. Sizes and times are the CI's; docs/performance.md has the figures at 1,000
namespaces."""

from __future__ import annotations

from bench.bench_namespaces import RESOURCES, Apf, measure


def test_the_limit_keeps_a_many_namespace_start_out_of_429s() -> None:
    result = measure(namespaces=12, timeout=120.0, apf=Apf(concurrency=1, queue_wait=0.5, queue_length=2,
                                                                   latency=0.05),
                     limit=(5.0, 2))
    assert result["informers"] == 12 * len(RESOURCES)
    limited, unlimited = result["modes"]["limited"], result["modes"]["unlimited"]
    for mode in (limited, unlimited):
        assert mode["synced"], result
        assert mode["requests"] >= result["informers"]  # a list per informer at least
        assert mode["bytes"] > 0
    assert limited["rejected_429"] == 0, result
    assert limited["throttled_requests"] > 0
    assert unlimited["rejected_429"] > 0, result
    assert unlimited["throttled_s"] == 0
