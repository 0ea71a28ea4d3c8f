"""A burst of Kubernetes Events through the bridge, with real processes, across a SIGKILL.

The simulator (its own process) emits Events as a cluster does (``--events-rate``: both APIs, count
and series bumps, Pods deleted and re-created, Events expiring); the bridge (``kube-event-bridge
run``, its own process) watches both Event APIs with ``profile: events``, a coalescing window and
enrichment, and sends to Kafka (Tansu) and to a webhook (a real HTTP server in this process). It is
SIGKILLed partway through and started again. Then, counted from what the sinks hold — Kafka read back
with confluent-kafka and every record parsed with the official CloudEvents SDK's Kafka binding, the
webhook's requests with its HTTP binding:

- nothing is lost: every Event created is in Kafka; every Event's last state (its final count) is
  there; every expired Event has its delete;
- enrichment is present (``ok`` or ``gone``, with the labels the object had) on every Event whose
  object existed when it was created — except, as docs/events.md says, for Events about Pods
  deleted while the bridge was down (or just before it was killed, their Events not yet
  acknowledged): a restarted bridge never saw those Pods, and answers ``unknown``;
- the coalescing window is honoured: within one run of the bridge, a repetition of one Event sent
  after another is handed to the sink at least the window after the repetition that followed the
  first was made (the simulator's ledger times each one), and fewer repetitions are sent than were made;
- the routing is correct: the webhook holds exactly the Events its rules select.

The rate and duration default to 1,000 Event changes per second for ``KEB_EVENTS_BURST_SECONDS``
(10 here, to keep the suite short); ``scripts/events-burst`` runs the full minute.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import orjson
import pytest
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat

from bridge.clock import RealClock
from bridge.kube.apiclient import ApiClient
from bridge.testing import WebhookReceiver
from bridge.testing.processes import ServiceProcess, SimulatorProcess
from tests import brokers
from tests.brokers import TansuBroker, unique_name

kafka_broker = brokers.kafka_broker

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("KEB_EVENTS_BURST_SECONDS", "10"))
RATE = float(os.environ.get("KEB_EVENTS_BURST_RATE", "1000"))
WINDOW = 1.0
FMT = JSONFormat()


def received(hook: WebhookReceiver) -> list[dict[str, Any]]:
    """The CloudEvents the webhook accepted, each request read by the CloudEvents SDK."""
    messages = [ce_http.HTTPMessage(headers=r.headers, body=r.body) for r in hook.accepted]
    return [attributes(ce_http.from_http(m, FMT)) for m in messages]


def attributes(event: Any) -> dict[str, Any]:
    attrs = dict(event.get_attributes())
    data = event.get_data()
    attrs["data"] = orjson.loads(data) if isinstance(data, (bytes, str)) else data
    attrs["time"] = attrs["time"].astimezone(UTC)
    return attrs


def simulator(tmp: Path, ledger: Path) -> SimulatorProcess:
    """The simulator process, its Events held back until SIGUSR1."""
    return SimulatorProcess(log=tmp / "sim.log", kubeconfig=tmp / "sim.kubeconfig", cwd=ROOT, args=(
        "--history-size", "2000000", "--bookmark-interval", "1", "--namespaces", "web,shop",
        "--events-rate", str(RATE), "--events-duration", str(SECONDS), "--events-wait-signal",
        "--events-deployments", "20", "--events-pods", "10", "--events-max", "20000",
        "--events-ledger", str(ledger), "--seed", "26"))


def bridge_config(tmp: Path, kubeconfig: Path, kafka: TansuBroker, topic: str, hook: WebhookReceiver) -> Path:
    cfg = {
        "cluster": "burst",
        "kubernetes": {"kubeconfig": str(kubeconfig), "in_cluster": "false"},
        "resources": [{"resource": "events", "profile": "events"},
                      {"resource": "events.events.k8s.io", "profile": "events"}],
        "events": {"coalesce_window": WINDOW,
                   "enrichment": {"kinds": ["pods", "replicasets.apps", "deployments.apps"]}},
        "sinks": [
            {"name": "kafka", "kind": "kafka", "brokers": kafka.bootstrap, "destination": topic,
             "content_mode": "binary", "linger_ms": 5},
            {"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{hook.port}/events",
             "retry": {"initial": 0.05, "max": 0.5},
             "routing": {"events": {"match": [{"types": ["Warning"]}],
                                    "drop": [{"reasons": ["BackOff"]}, {"message": "^FailedMount"}]}}},
        ],
        # Its own spill: under the default (./.kube-event-bridge/spill, from the working directory all
        # the suite's bridges share) another test's bridge, starting, removes it as "no longer configured".
        "checkpoint": {"store": "file", "directory": str(tmp / "checkpoints"), "interval": 0.2,
                       "spill_directory": str(tmp / "spill")},
        "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "logging": {"level": "info", "format": "json"},
        "shutdown_deadline": 20,
    }
    path = tmp / "bridge.yaml"
    path.write_bytes(orjson.dumps(cfg))
    return path


async def final_events(kubeconfig: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """uid → (count, Event) of every Event the simulator holds now."""
    client = ApiClient.from_kubeconfig(str(kubeconfig), clock=RealClock())
    try:
        out: dict[str, tuple[int, dict[str, Any]]] = {}
        for path in ("/api/v1/events", "/apis/events.k8s.io/v1/events"):
            for item in (await client.get(path))["items"]:
                series = (item.get("series") or {}).get("count")
                count = int(series or item.get("count") or 1)
                out[item["metadata"]["uid"]] = (count, item)
        return out
    finally:
        await client.close()


def as_bytes(value: str | bytes | None) -> bytes:
    return value.encode() if isinstance(value, str) else (value or b"")


def read_kafka(kafka: TansuBroker, topic: str, partitions: int = 3) -> list[dict[str, Any]]:
    """Every record of ``topic``, parsed with the SDK's Kafka binding; ``_ts`` is the record's
    timestamp (the producer's, when the bridge handed the event to librdkafka)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique_name("reader"),
                         "enable.auto.commit": False})
    try:
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                 for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pos = dict.fromkeys(range(partitions), 0)
        out = []
        deadline = time.monotonic() + 60
        while any(pos[p] < highs[p] for p in pos) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=5000, timeout=0.5):
                if msg.error() is not None:
                    continue
                found = msg.headers() or []
                pairs = found.items() if isinstance(found, dict) else found
                headers = {str(k): as_bytes(v) for k, v in pairs}
                message = ce_kafka.KafkaMessage(headers=headers, key=as_bytes(msg.key()),
                                                value=as_bytes(msg.value()))
                attrs = attributes(ce_kafka.from_kafka(message, FMT))
                attrs.pop("partitionkey", None)
                attrs["_ts"] = msg.timestamp()[1] / 1000.0
                out.append(attrs)
                pos[int(msg.partition() or 0)] = int(msg.offset() or 0) + 1
        assert all(pos[p] >= highs[p] for p in pos), "Kafka could not be read to its end"
        return out
    finally:
        consumer.close()


async def repeated_in_kafka(kafka: TansuBroker, topic: str, *, deadline: float) -> None:
    """Returns once Kafka holds two repetitions (updates) of one Event."""
    while True:
        records = await asyncio.to_thread(read_kafka, kafka, topic)
        updates = collections.Counter(r["uid"] for r in records if r["type"].endswith(".updated"))
        if updates and max(updates.values()) >= 2:
            return
        assert time.monotonic() < deadline, "the bridge never sent an Event twice"
        await asyncio.sleep(0.5)


@pytest.mark.timeout(max(600, int(SECONDS * 20)))
async def test_a_burst_of_events_survives_a_sigkill_enriched_coalesced_and_routed(
        tmp_path: Path, kafka_broker: TansuBroker) -> None:
    topic = unique_name("k8s.events")
    kafka_broker.create_topic(topic, partitions=3)
    hook = await WebhookReceiver().start()
    ledger_path = tmp_path / "ledger.jsonl"
    log = tmp_path / "bridge.log"
    bridge: ServiceProcess | None = None
    try:
        async with simulator(tmp_path, ledger_path) as sim:
            kubeconfig = sim.kubeconfig
            config = bridge_config(tmp_path, kubeconfig, kafka_broker, topic, hook)
            bridge = ServiceProcess(config=config, log=log, cwd=ROOT)
            await bridge.start()
            await bridge.wait_ready()
            os.kill(sim.pid, signal.SIGUSR1)  # the Events start now
            # Killed once this run has sent some Event again (the window's check needs one), not
            # after a fixed time: a loaded machine may have let it send nothing repeated by then.
            await asyncio.sleep(SECONDS * 0.4)
            await repeated_in_kafka(kafka_broker, topic, deadline=time.monotonic() + SECONDS * 4 + 60)
            killed_at = time.time()
            await bridge.kill()
            await asyncio.sleep(1.0)
            await bridge.restart()
            await bridge.wait_ready()
            restarted_at = time.time()
            await sim.wait_log("events done", timeout=SECONDS * 4 + 60)
            final = await final_events(kubeconfig)

            # Caught up: the last state of every live Event is in Kafka (read until it is).
            def last_counts(records: list[dict[str, Any]]) -> dict[str, int]:
                counts: dict[str, int] = {}
                for r in records:
                    counts[r["uid"]] = max(counts.get(r["uid"], 0), int(r["count"]))
                return counts

            deadline = time.monotonic() + SECONDS * 6 + 120
            while True:
                records = read_kafka(kafka_broker, topic)
                seen = last_counts(records)
                missing = [u for u, (c, _) in final.items() if seen.get(u, 0) < c]
                if not missing:
                    break
                assert time.monotonic() < deadline, (
                    f"{len(missing)} Events' last states never reached Kafka (uid: last count, the "
                    f"highest in Kafka): {({u: (final[u][0], seen.get(u)) for u in missing[:10]})}; "
                    f"the bridge's log: {log}")
                await asyncio.sleep(2.0)
            assert await bridge.stop(timeout=60) == 0
        records = read_kafka(kafka_broker, topic)
    finally:
        if bridge is not None:
            await bridge.kill()
        await hook.close()

    ledger, deletions, bumped_at = [], {}, {}
    for line in ledger_path.read_bytes().splitlines():
        entry = orjson.loads(line)
        if "deleted_pod" in entry:
            deletions[entry["deleted_pod"]] = entry["at"]
        elif "bumped" in entry:
            bumped_at[(entry["bumped"], entry["count"])] = entry["at"]
        else:
            ledger.append(entry)
    by_uid = {e["uid"]: e for e in ledger}
    assert len(ledger) > RATE * SECONDS * 0.2

    # Nothing lost: every Event created, every last state, every expiry.
    kafka_uids = {r["uid"] for r in records}
    assert set(by_uid) <= kafka_uids
    kafka_counts = last_counts(records)
    assert all(kafka_counts[u] >= c for u, (c, _) in final.items())
    expired = set(by_uid) - set(final)
    deleted = {r["uid"] for r in records if r["type"].endswith(".deleted")}
    assert expired <= deleted

    # Every record is an annotated Event with the routing attributes.
    for r in records:
        entry = by_uid[r["uid"]]
        assert r["reason"] == entry["reason"]
        assert r["eventtype"] == entry["type"]
        assert r["involveduid"] == entry["involved_uid"]
        assert r["apiversion"] == entry["api"]

    # Enrichment on every Event whose object existed, but those a restarted bridge could not see:
    # sent after the kill about a Pod deleted before the restarted bridge was watching. (Not "deleted
    # in the few seconds before the kill": a loaded bridge is further behind than that, and its kill
    # waits for a repetition.)
    blind_to = restarted_at + 2.0
    unknown_allowed = collections.Counter[str]()
    for r in records:
        entry = by_uid[r["uid"]]
        if not entry["existed"]:
            assert r["enrichment"] in ("gone", "unknown")
            continue
        at = deletions.get(entry["involved_uid"])
        if r["enrichment"] == "unknown" and at is not None and at <= blind_to and r["_ts"] >= killed_at:
            unknown_allowed[r["uid"]] += 1
            continue
        if r["enrichment"] not in ("ok", "gone"):
            notes = [line for line in log.read_text().splitlines() if "enrichment" in line][-20:]
            pytest.fail(f"{r['type']} of Event {r['uid']} about {entry['involved_kind']} "
                        f"{entry['involved_uid']} (existed; deleted at {at}, killed at {killed_at}, "
                        f"ready again at {restarted_at}, sent at {r['_ts']}): enrichment {r['enrichment']}; "
                        f"the bridge's log says: {notes}")
        assert orjson.loads(r["involvedlabels"]) == entry["labels"]
        if entry["involved_kind"] == "Pod":
            assert f"{r['ownerkind']}/{r['ownername']}" == entry["owner_top"]
    assert len(unknown_allowed) <= max(50, len(ledger) // 100)

    # The coalescing window, as docs/events.md promises it: a repetition is held for the window from
    # its arrival, and one arriving while another is held replaces it. So of two repetitions A, B of
    # one Event sent one after the other in one run, B's hold began with a repetition that came after A
    # was handed on (an earlier one would have replaced A), at the earliest repetition A.count + 1,
    # which the simulator made (the ledger's time) before the bridge could see it: B was handed to the
    # sink at least the window after that. The records' timestamps (when the bridge handed each to
    # librdkafka, in ms) are not the hand-over: a record waits behind its object's previous one until
    # that is acknowledged, so A may be produced late and B on time, closer than the window. A delete
    # sends a held repetition at once (a documented exception): B followed by its delete is skipped.
    sent_updates = [r for r in records if r["type"].endswith(".updated")]
    bumps = sum(c - 1 for c, _ in final.values())
    assert len(sent_updates) < bumps
    runs = [(0.0, killed_at), (killed_at, float("inf"))]  # records are stamped when produced
    spacing_checked, closest, closest_records = 0, float("inf"), float("inf")
    for (start, end) in runs:
        per_event: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
        deleted_in_run = {r["uid"] for r in records
                          if r["type"].endswith(".deleted") and start <= r["_ts"] < end}
        for r in sent_updates:
            if start <= r["_ts"] < end:
                per_event[r["uid"]].append((r["_ts"], int(r["count"])))
        for uid, sent in per_event.items():
            sent.sort(key=lambda s: s[1])
            for (ts_a, count_a), (ts_b, count_b) in itertools.pairwise(sent):
                if count_b == count_a or (uid in deleted_in_run and (ts_b, count_b) == sent[-1]):
                    continue  # the same state again (redelivered), or sent early by its delete
                next_made = bumped_at[(uid, count_a + 1)]
                assert ts_b + 0.001 >= next_made + WINDOW, (
                    f"Event {uid}: count {count_b} sent at {ts_b:.3f}, {ts_b - next_made:.3f} s after the "
                    f"repetition that followed the count {count_a} sent before it was made")
                spacing_checked += 1
                closest = min(closest, ts_b - next_made)
                closest_records = min(closest_records, ts_b - ts_a)
    assert spacing_checked > 0

    # Routing: the webhook holds exactly the selected Events, each of them in its last state.
    def selected(r: dict[str, Any]) -> bool:
        text = r["data"].get("message", r["data"].get("note", ""))
        return r["eventtype"] == "Warning" and r["reason"] != "BackOff" and not text.startswith("FailedMount")

    hook_received = received(hook)
    assert all(selected(r) for r in hook_received)
    assert {r["uid"] for r in hook_received} == {r["uid"] for r in records if selected(r)}
    hook_counts = last_counts(hook_received)
    assert all(hook_counts[u] >= c for u, (c, ev) in final.items() if u in hook_counts)
    print(f"\nburst: {len(ledger)} Events created, {bumps} repetitions made, {len(records)} Kafka records "
          f"({len(sent_updates)} repetitions sent), {len(hook_received)} webhook requests, "
          f"{len(unknown_allowed)} Events about Pods deleted while the bridge was down, "
          f"{spacing_checked} spacings checked (the closest {closest:.3f} s after the repetition it follows; "
          f"records {closest_records:.3f} s apart at the closest)")
