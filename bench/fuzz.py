"""Long fuzzing runs of the decoders and loaders (``bench/fuzz_targets.py``), one process per target.

    python -m bench.fuzz --target watch-line --runs 1000000       # one target
    python -m bench.fuzz --all --runs 1000000                      # every target, one after another

With atheris installed (``pip install 'kube-event-bridge[fuzz]'``) the runs are coverage-guided
(libFuzzer, started from the seed corpus, with a per-input timeout and a memory limit, so a hang or
an unbounded allocation is reported as well as a crash); without it, hypothesis generates the inputs
(slower, no coverage feedback). A failing input is written to ``--artifacts`` (default
``bench/results/fuzz``) and the run stops there; replay it with ``--replay FILE``. Each run prints the
number of inputs it executed; ``docs/performance.md`` has the counts of the last long run.

Run it at low priority on a shared machine: ``nice -n 19 python -m bench.fuzz --all``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ARTIFACTS = Path(__file__).parent / "results" / "fuzz"


_UNDER_TEST = ["bridge.rawobject", "bridge.rawobject_type", "bridge.rawobject_decode",
               "bridge.managed_fields", "bridge.kube.listwatch", "bridge.kube.watchdecode",
               "bridge.kube.listdecode", "bridge.storage.checkpoint", "bridge.service.config",
               "bridge.service.config_cluster", "bridge.service.config_runtime", "bridge.kube.labels"]
"""The modules whose coverage guides the fuzzer (instrumenting everything loaded costs minutes)."""


def _run_atheris(target: str, runs: int, artifacts: Path, timeout: int, rss_limit_mb: int) -> int:
    import atheris

    with atheris.instrument_imports(include=_UNDER_TEST):
        from bench.fuzz_targets import SEEDS, TARGETS
    corpus = Path(tempfile.mkdtemp(prefix=f"keb-fuzz-{target}-"))
    for i, seed in enumerate(SEEDS[target]):
        (corpus / f"seed-{i}").write_bytes(seed)
    artifacts.mkdir(parents=True, exist_ok=True)
    test = TARGETS[target]
    args = [sys.argv[0], f"-runs={runs}", f"-timeout={timeout}", f"-rss_limit_mb={rss_limit_mb}",
            f"-artifact_prefix={artifacts}/{target}-", "-max_len=65536", "-print_final_stats=1", str(corpus)]
    atheris.Setup(args, test)
    atheris.Fuzz()  # exits the process when the runs are done (0) or at the first failure
    return 0


def _run_hypothesis(target: str, runs: int) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from bench.fuzz_targets import SEEDS, TARGETS

    test = TARGETS[target]

    @settings(max_examples=runs, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.binary(max_size=4096), st.sampled_from(SEEDS[target]),
                     st.builds(_mutate, st.sampled_from(SEEDS[target]), st.binary(max_size=64),
                               st.integers(0, 4096))))
    def run(data: bytes) -> None:
        test(data)

    started = time.monotonic()
    run()
    print(f"Done {runs} runs in {time.monotonic() - started:.0f} second(s) (hypothesis)")
    return 0


_TARGET_NAMES = ("checkpoint", "config", "list", "watch-line")


def _mutate(seed: bytes, insert: bytes, at: int) -> bytes:
    at = at % (len(seed) + 1)
    return seed[:at] + insert + seed[at + len(insert) // 2:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=_TARGET_NAMES)
    parser.add_argument("--all", action="store_true", help="every target, each in its own process")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--engine", choices=["auto", "atheris", "hypothesis"], default="auto")
    parser.add_argument("--artifacts", type=Path, default=_ARTIFACTS)
    parser.add_argument("--timeout", type=int, default=10,
                        help="seconds per input before it counts as a hang")
    parser.add_argument("--rss-limit-mb", type=int, default=1024)
    parser.add_argument("--replay", type=Path, help="run --target on this one input and report")
    args = parser.parse_args(argv)
    if args.all:
        failed = 0
        for target in _TARGET_NAMES:
            cmd = [sys.executable, "-m", "bench.fuzz", "--target", target, "--runs", str(args.runs),
                   "--engine", args.engine, "--artifacts", str(args.artifacts),
                   "--timeout", str(args.timeout), "--rss-limit-mb", str(args.rss_limit_mb)]
            print(f"== {target}", flush=True)
            failed |= subprocess.call(cmd) != 0
        return 1 if failed else 0
    if args.target is None:
        parser.error("give --target or --all")
    if args.replay is not None:
        from bench.fuzz_targets import TARGETS

        TARGETS[args.target](args.replay.read_bytes())
        print("no failure")
        return 0
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "hypothesis"
    if engine == "atheris":
        return _run_atheris(args.target, args.runs, args.artifacts, args.timeout, args.rss_limit_mb)
    return _run_hypothesis(args.target, args.runs)


if __name__ == "__main__":
    sys.exit(main())
