"""What the decoders' depth and size bound costs on the hot path (issue #35).

Every watch line and List item is checked against :data:`bridge.jsonbounds.MAX_DEPTH` before it is
decoded: a length and two ``bytes.count`` calls for an object with at most 200 brackets, an exact
measure (:func:`bridge.jsonbounds.depth`) above. This decodes the same realistic Pods (the
simulator's ``make_pod``: ~4.5 KB, managedFields cut as the service does; and padded ones of
``--big`` bytes, whose brackets pass the bound so that the exact measure runs) with the bounded
decoder and the same decoder without the check (``raw_object_decoder(bounded=False)``), in
alternating rounds of one run, and reports the best round of each (CPU time of the process) and
their ratio (bounded / plain: 1.0 means free). The dict decoder (``cache.compact: false``) is
measured the same way against its unbounded msgspec pass.

``python -m bench.bench_bounds [--quick]``; results go to ``bench/results/bounds.json``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from bench.common import machine_info, write_result
from bridge.contracts import WatchEvent
from bridge.jsonbounds import depth
from bridge.kube.listwatch import decode_watch_event, raw_object_decoder
from bridge.sim.objects import make_pod

Decoder = Callable[[bytes], Any]


class _Event(msgspec.Struct):
    type: str
    object: dict[str, Any]


_plain_dict = msgspec.json.Decoder(_Event)


def _lines(count: int, size: int | None, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        pod = make_pod(f"web-{i}", f"ns-{i % 7}", size_bytes=size, rng=rng)
        meta = pod.setdefault("metadata", {})
        meta.update({"uid": f"uid-{i:08d}", "resourceVersion": str(1000 + i)})
        out.append(orjson.dumps({"type": "MODIFIED", "object": pod}))
    return out


def _round(decode: Decoder, lines: list[bytes]) -> float:
    """CPU seconds of this process (not wall time: the machines these run on are shared)."""
    start = time.process_time()
    for line in lines:
        decode(line)
    return time.process_time() - start


def _pair(bounded: Decoder, plain: Decoder, lines: list[bytes], rounds: int) -> dict[str, Any]:
    best_b = best_p = float("inf")
    for _ in range(rounds):
        best_p = min(best_p, _round(plain, lines))
        best_b = min(best_b, _round(bounded, lines))
    n = len(lines)
    return {"lines": n, "bytes_per_line": sum(map(len, lines)) // n,
            "brackets_per_line": sum(x.count(b"{") + x.count(b"[") for x in lines) // n,
            "depth": max(depth(x) for x in lines),
            "bounded_us": round(best_b / n * 1e6, 3), "plain_us": round(best_p / n * 1e6, 3),
            "ratio": round(best_b / best_p, 3)}


def _dict_plain(line: bytes) -> WatchEvent:
    return _plain_dict.decode(line)  # type: ignore[return-value]


def run(quick: bool = False, big: int = 20_000, seed: int = 35) -> dict[str, Any]:
    count, rounds = (300, 9) if quick else (1000, 21)
    bounded_raw = raw_object_decoder(drop_managed_fields=True)
    plain_raw = raw_object_decoder(drop_managed_fields=True, bounded=False)
    results: dict[str, Any] = {"machine": machine_info(), "seed": seed, "rounds": rounds}
    for name, size in (("pod", None), (f"pod_{big}", big)):
        lines = _lines(count, size, seed)
        results[f"raw_object/{name}"] = _pair(bounded_raw, plain_raw, lines, rounds)
        results[f"dict/{name}"] = _pair(decode_watch_event, _dict_plain, lines, rounds)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_bounds")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--big", type=int, default=20_000, help="size of the padded Pods (bytes)")
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args(argv)
    results = run(args.quick, args.big, args.seed)
    for key, value in results.items():
        if isinstance(value, dict) and "ratio" in value:
            print(f"{key:24s} bounded {value['bounded_us']:8.2f} us  plain {value['plain_us']:8.2f} us  "
                  f"ratio {value['ratio']:.3f}  ({value['bytes_per_line']} B, {value['brackets_per_line']} "
                  f"brackets, depth {value['depth']})")
    write_result("bounds", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
