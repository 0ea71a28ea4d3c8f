"""The ``kube-event-bridge`` command.

Subcommands::

    run           the service: informers → sinks, checkpoints, health/metrics endpoint
    sim           the API-server simulator (for demos, tests and benchmarks)
    demo          simulator + churn + bridge + stdout/file sinks, the embedded default
    check-config  validate a configuration file and print it with secrets masked; with
                  ``--cluster``, also resolve every resource and check RBAC against the cluster
    snapshot      ask a running bridge for a resync snapshot
    verify        compare what a sink holds with the cluster's current state

Exit codes: 0 success; 1 runtime failure; 2 bad usage or invalid configuration; 130 interrupted.
``verify``: 0 the sink's state equals the cluster's, 1 it differs, 2 bad usage or nothing to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from bridge.errors import BridgeError, ConfigurationError
from bridge.version import __version__

__all__ = ["EXIT_CONFIG", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kube-event-bridge",
        description="Forward every Kubernetes object change to Kafka, NATS and webhooks as CloudEvents.",
        epilog="Exit codes: 0 ok, 1 runtime failure, 2 bad usage or configuration, 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run the bridge service",
                         description="Run the bridge: watch the configured resources and forward every "
                                     "change to the configured sinks.")
    run.add_argument("-c", "--config", help="YAML configuration file (or $KEB_CONFIG_FILE)")

    sub.add_parser("sim", help="run the API-server simulator", add_help=False,
                   description="Run the API-server simulator; `kube-event-bridge sim --help` for options.")

    _add_demo(sub)
    _add_check_config(sub)
    _add_snapshot(sub)
    _add_verify(sub)
    return p


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="simulator + churn + bridge, events to stdout and a file",
                          description="Start the API-server simulator with churn, run the bridge against "
                                      "it and print the events; they are also written to --output.")
    demo.add_argument("--duration", type=float, default=15.0,
                      help="seconds to run (0 = until interrupted; default 15)")
    demo.add_argument("--rate", type=float, default=20.0, help="changes per second (default 20)")
    demo.add_argument("--objects", type=int, default=30, help="pods kept alive by the churn (default 30)")
    demo.add_argument("--output", default="demo-events.jsonl",
                      help="JSON-lines file the events are written to (default demo-events.jsonl)")
    demo.add_argument("--quiet", action="store_true", help="do not print events, only progress")
    demo.add_argument("--seed", type=int, default=7)


def _add_check_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser("check-config", help="validate a config file, print it with secrets masked",
                           description="Validate the configuration (including every sink's options) "
                                       "and print the effective configuration with secrets masked.")
    check.add_argument("-c", "--config", help="YAML configuration file (or $KEB_CONFIG_FILE)")
    check.add_argument("--cluster", action="store_true",
                       help="also ask the cluster: resolve every resource through discovery and check "
                            "with SelfSubjectAccessReview that the credentials may list and watch it "
                            "(and get it when a selector is set); exit 2 naming each problem")
    check.add_argument("--kubeconfig", help="with --cluster: the kubeconfig to use (default: the "
                                            "config's kubernetes section, else in-cluster or ~/.kube/config)")
    check.add_argument("--context", help="with --cluster: the kubeconfig context")


def _add_snapshot(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    snap = sub.add_parser("snapshot", help="ask a running bridge for a resync snapshot",
                          description="POST /snapshot to a running bridge's admin listener "
                                      "(127.0.0.1:8081 in the pod; from outside: kubectl port-forward "
                                      "deploy/kube-event-bridge 8081).")
    snap.add_argument("--url", default="http://127.0.0.1:8081",
                      help="the bridge's admin endpoint (default http://127.0.0.1:8081)")
    snap.add_argument("--resource", help="only this resource (as configured, e.g. pods)")
    snap.add_argument("--sink", help="only to this sink (by name); the other sinks receive nothing")
    snap.add_argument("--token-file",
                      help="file holding the bearer token (server.admin_token_file; or $KEB_ADMIN_TOKEN)")


def _add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ver = sub.add_parser(
        "verify", help="compare what a sink holds with the cluster's current state",
        description="Read everything a sink holds (a Kafka topic, a JetStream stream or a JSON-lines "
                    "file), rebuild the state it describes, list the cluster, and report per resource "
                    "the objects missing from the sink, phantom objects (alive in the sink, gone from "
                    "the cluster), stale objects, altered objects (at the cluster's resourceVersion "
                    "but holding another value), duplicate event ids, per-object order violations "
                    "and gap markers.",
        epilog="Exit codes: 0 the sink's state equals the cluster's; 1 it differs; 2 bad usage, or the "
               "sink or the cluster could not be read.")
    ver.add_argument("-c", "--config", help="the bridge's configuration: Kubernetes access, resources "
                                            "and cluster name are taken from it")
    ver.add_argument("--kubeconfig", help="kubeconfig to list the cluster with (default: the config's, "
                                          "else in-cluster or ~/.kube/config)")
    ver.add_argument("--context", help="kubeconfig context")
    ver.add_argument("--resource", action="append", default=[], metavar="RESOURCE[@NAMESPACE]",
                     help="a resource to verify (repeatable); default: the config's resources")
    ver.add_argument("--cluster", help="only events of this cluster name (default: the config's cluster; "
                                       "without a config, every event)")
    src = ver.add_mutually_exclusive_group()
    src.add_argument("--sink", metavar="NAME", help="a sink of the --config file: where and how to read "
                                                     "it (file, kafka, jetstream) comes from its options")
    src.add_argument("--file", metavar="PATH", help="a file sink's JSON-lines output")
    src.add_argument("--kafka", metavar="BROKERS", help="Kafka bootstrap servers (with --topic)")
    src.add_argument("--jetstream", metavar="SERVERS", help="NATS server URL(s) (with --stream)")
    ver.add_argument("--topic", action="append", default=[], help="Kafka topic (repeatable)")
    ver.add_argument("--stream", help="JetStream stream name")
    ver.add_argument("--json", action="store_true", help="print the report as JSON")
    ver.add_argument("--strict", action="store_true",
                     help="per-object order violations fail the check (the default; kept for scripts)")
    ver.add_argument("--allow-order-violations", action="store_true",
                     help="report per-object order violations without failing the check")
    ver.add_argument("--timeout", type=float, default=60.0,
                     help="seconds to read the sink and list the cluster (default 60)")


def _check_config(path: str | None) -> int:
    from bridge.service.config import load_config, masked_dump
    from bridge.service.validation import insecure_warnings, validate_sinks

    cfg = load_config(path)
    sinks = validate_sinks(cfg)
    for warning in insecure_warnings(cfg, sinks):
        sys.stderr.write(f"kube-event-bridge: warning: {warning}\n")
    sys.stdout.write(yaml.safe_dump(masked_dump(cfg), sort_keys=False))
    sys.stdout.write("# configuration is valid\n")
    return EXIT_OK


def _check_cluster(path: str | None, kubeconfig: str | None, context: str | None) -> int:
    """``check-config --cluster``'s second half: the cluster's answers (see cluster_check)."""
    from bridge.kube.apiclient import ApiClient
    from bridge.service.cluster_check import check_cluster
    from bridge.service.config import load_config
    from bridge.service.service import _api_client

    cfg = load_config(path)

    async def go() -> int:
        if kubeconfig is not None or context is not None:
            client = ApiClient.from_kubeconfig(kubeconfig, context)
        else:
            from bridge.clock import RealClock

            client = _api_client(cfg, RealClock())
        async with client:
            problems = await check_cluster(cfg, client)
            where = client.server
        if problems:
            for problem in problems:
                sys.stderr.write(f"kube-event-bridge: {problem}\n")
            sys.stderr.write(f"kube-event-bridge: {len(problems)} problem(s) with the cluster at {where}\n")
            return EXIT_CONFIG
        sys.stdout.write(f"# every resource is served by {where} and the credentials may watch it\n")
        return EXIT_OK

    return asyncio.run(go())


def _snapshot(url: str, resource: str | None, token_file: str | None, sink: str | None = None) -> int:
    import aiohttp

    from bridge.bounded_read import ERROR_BODY_LIMIT, read_prefix

    token = os.environ.get("KEB_ADMIN_TOKEN", "")
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise ConfigurationError(f"--token-file: cannot read {token_file}: {e.strerror}") from e
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def go() -> int:
        params = {"resource": resource} if resource else {}
        if sink:
            params["sink"] = sink
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    f"{url.rstrip('/')}/snapshot", params=params, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=30)) as resp:
                head, _ = await read_prefix(resp, ERROR_BODY_LIMIT)
                body = head.decode(errors="replace")
                if resp.status == 202:
                    sys.stdout.write(body + "\n")
                    return EXIT_OK
                sys.stderr.write(f"snapshot refused ({resp.status}): {body}\n")
                return EXIT_FAILURE
        except aiohttp.ClientError as e:
            sys.stderr.write(f"cannot reach the bridge at {url}: {e}\n")
            return EXIT_FAILURE

    return asyncio.run(go())


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = None if args_list[:1] == ["sim"] else _parser().parse_args(args_list)
    try:
        if args is None:
            from bridge.sim.cli import sim_main

            return sim_main(args_list[1:], prog="kube-event-bridge sim")
        if args.command == "run":
            from bridge.service.service import run_service

            return run_service(args.config)
        if args.command == "demo":
            from bridge.service.demo import run_demo

            return run_demo(duration=args.duration, rate=args.rate, objects=args.objects,
                            output=args.output, quiet=args.quiet, seed=args.seed)
        if args.command == "check-config":
            code = _check_config(args.config)
            if code != EXIT_OK or not args.cluster:
                return code
            return _check_cluster(args.config, args.kubeconfig, args.context)
        if args.command == "snapshot":
            return _snapshot(args.url, args.resource, args.token_file, args.sink)
        if args.command == "verify":
            from bridge.service.verify_cli import run_verify

            return run_verify(args)
    except ConfigurationError as e:
        sys.stderr.write(f"kube-event-bridge: {e}\n")
        return EXIT_CONFIG
    except BridgeError as e:
        sys.stderr.write(f"kube-event-bridge: {e}\n")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:  # the last line of defence: a message, never a traceback
        sys.stderr.write(f"kube-event-bridge: unexpected error ({type(e).__name__}): {e}\n"
                         "this is a bug; please report it with the command and configuration used\n")
        return EXIT_FAILURE
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
