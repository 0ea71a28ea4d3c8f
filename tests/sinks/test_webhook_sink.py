"""WebhookSink against a real local aiohttp server: envelope, signature, auth, binary mode, batches,
retries (500, timeouts, 429 + Retry-After) without loss or reordering, dead letters, isolation from a
slow webhook, TLS with a custom CA and mTLS, bad configuration."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from standardwebhooks import Webhook

from bridge.testing import ReceivedRequest, Reply, WebhookReceiver
from sinks.contract import DeliveryOutcome, EventType, SinkConfigError
from sinks.file import FileSink
from sinks.redaction import REDACTED
from sinks.webhook import WebhookOptions, WebhookSink, parse_retry_after, sign
from tests.sinks import DEPLOYMENTS, SECRETS, T0, Acks, event, obj

Hook = WebhookReceiver
"""The kit's webhook receiver; these tests build it with ``path=""``: its ``url`` is the server's,
each test adds its own path."""


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    async with WebhookReceiver(path="") as h:
        yield h


def make(hook: Hook, **opts: Any) -> WebhookSink:
    base: dict[str, Any] = {"url": f"{hook.url}/events", "retry": {"initial": 0.01, "max": 0.05}}
    return WebhookSink.from_options("hook", {**base, **opts})


async def test_structured_events_are_posted_signed_and_authenticated(hook: Hook, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok-123\n")
    (tmp_path / "hmac").write_text("s3cret")
    sink = make(
        hook,
        destination="{resource}/{namespace}",
        hmac_secret_file=str(tmp_path / "hmac"),
        signature="hmac-sha256",
        auth={"bearer_token_file": str(tmp_path / "token")},
        headers={"X-Team": "platform"},
    )
    await sink.start()
    acks = Acks()
    secret = obj("db-creds", uid="u-s", rv="7", kind="Secret", data={"password": "aHVudGVyMg=="})
    await sink.deliver(event(EventType.ADDED, secret, resource=SECRETS), acks.cb("secret"))
    dep = obj("api", namespace="shop", uid="u-d", rv="9", kind="Deployment", api_version="apps/v1")
    await sink.deliver(event(EventType.DELETED, dep, resource=DEPLOYMENTS), acks.cb("dep"))
    assert await sink.flush(5)
    assert acks.outcomes == [("secret", DeliveryOutcome.DELIVERED), ("dep", DeliveryOutcome.DELIVERED)]
    by_path = {r.path: r for r in hook.accepted}
    assert sorted(by_path) == ["/events/deployments/shop", "/events/secrets/default"]
    for rec in hook.accepted:
        assert hmac.compare_digest(
            rec.headers["X-Signature-256"],
            "sha256=" + hmac.new(b"s3cret", rec.body, hashlib.sha256).hexdigest(),
        )
        assert "webhook-signature" not in rec.headers
        assert rec.headers["Authorization"] == "Bearer tok-123"
        assert rec.headers["X-Team"] == "platform"
        assert rec.headers["Content-Type"] == "application/cloudevents+json"
    ce = orjson.loads(by_path["/events/secrets/default"].body)
    assert {k: v for k, v in ce.items() if k not in ("id", "data")} == {
        "specversion": "1.0",
        "source": "/clusters/prod/api/v1/secrets",
        "type": "io.kube-event-bridge.added",
        "subject": "default/db-creds",
        "time": "2023-11-14T22:13:20.250000Z",
        "datacontenttype": "application/json",
        "cluster": "prod",
        "kind": "Secret",
        "apiversion": "v1",
        "namespace": "default",
        "name": "db-creds",
        "uid": "u-s",
        "resourceversion": "7",
    }
    assert len(ce["id"]) == 32
    assert ce["data"]["data"] == {"password": REDACTED}
    dce = orjson.loads(by_path["/events/deployments/shop"].body)
    assert dce["type"] == "io.kube-event-bridge.deleted"
    assert dce["source"] == "/clusters/prod/apis/apps/v1/deployments"
    assert dce["apiversion"] == "apps/v1"
    await sink.close()


async def test_binary_mode_puts_attributes_in_ce_headers(hook: Hook) -> None:
    sink = make(hook, content_mode="binary", auth={"username": "u", "password": "p"})
    acks = Acks()
    o = obj("web-0", uid="u-1", rv="42", labels={"app": "wéb"})
    await sink.deliver(event(EventType.ADDED, o), acks.cb("a"))
    assert await sink.flush(5)
    (rec,) = hook.accepted
    h = {k.lower(): v for k, v in rec.headers.items()}
    assert h["content-type"] == "application/json"
    assert h["ce-specversion"] == "1.0"
    assert h["ce-type"] == "io.kube-event-bridge.added"
    assert h["ce-source"] == "/clusters/prod/api/v1/pods"
    assert h["ce-subject"] == "default/web-0"
    assert h["ce-uid"] == "u-1"
    assert h["ce-resourceversion"] == "42"
    assert h["ce-time"] == "2023-11-14T22:13:20.250000Z"
    assert h["authorization"] == "Basic dTpw"
    assert "ce-data" not in h
    assert orjson.loads(rec.body) == o
    await sink.close()


async def test_batches_post_json_arrays(hook: Hook) -> None:
    sink = make(hook, batch={"max_events": 50, "linger": 0.05}, hmac_secret="k", signature="both")
    acks = Acks()
    for i in range(20):
        await sink.deliver(event(EventType.ADDED, obj(f"p{i}", rv=str(i))), acks.cb(f"p{i}"))
    assert await sink.flush(5)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 20
    assert 1 <= len(hook.accepted) < 20
    for rec in hook.accepted:
        assert rec.headers["Content-Type"] == "application/cloudevents-batch+json"
        assert rec.headers["X-Signature-256"] == sign(b"k", rec.body)
        Webhook(b"k").verify(rec.body, rec.headers)
    assert sorted(e["name"] for e in hook.events) == sorted(f"p{i}" for i in range(20))
    await sink.close()


async def test_500s_timeouts_and_429_lose_nothing_and_keep_per_object_order(hook: Hook) -> None:
    answers = iter(["500", "slow", "429", "500", "slow", "503", "408"])
    seen: list[tuple[str, str, float]] = []

    async def respond(request: ReceivedRequest) -> Reply:
        what = next(answers, "ok")
        seen.append((orjson.loads(request.body)["name"], what, time.monotonic()))
        if what == "slow":
            return Reply(500, delay=0.5)  # longer than the sink's timeout: the client gives up
        if what == "429":
            return Reply(429, retry_after="0.3")
        if what != "ok":
            return Reply(int(what), body="busy")
        return Reply(200)

    hook.respond = respond
    sink = make(hook, timeout=0.1, retry={"initial": 0.01, "max": 0.02})
    acks = Acks()
    names = [f"o{i}" for i in range(5)]
    for rv in range(1, 5):
        for n in names:
            await sink.deliver(event(EventType.UPDATED, obj(n, rv=str(rv))), acks.cb(f"{n}@{rv}"))
    assert await sink.flush(10)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 20
    got: dict[str, list[str]] = {}
    for ce in hook.events:
        got.setdefault(ce["name"], []).append(ce["resourceversion"])
    assert got == {n: ["1", "2", "3", "4"] for n in names}
    assert sink.stats.retries == 7
    # The retry of the event answered 429 waited for Retry-After (0.3 s), not the 10 ms backoff.
    i = next(i for i, (_, what, _) in enumerate(seen) if what == "429")
    name, _, at = seen[i]
    retried_at = next(t for n, _, t in seen[i + 1 :] if n == name)
    assert retried_at - at >= 0.29
    assert sink.healthy()
    await sink.close()


async def test_400_goes_to_dead_letter_file_with_reason(hook: Hook, tmp_path: Path) -> None:
    async def respond(request: ReceivedRequest) -> Reply:
        if orjson.loads(request.body)["name"] == "bad":
            return Reply(400, body="schema rejected: spec.replicas")
        return Reply(202)

    hook.respond = respond
    dl = tmp_path / "dead.jsonl"
    sink = make(hook, dead_letter={"kind": "file", "target": str(dl)})
    await sink.start()
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("bad", uid="u-bad")), acks.cb("bad"))
    await sink.deliver(event(EventType.ADDED, obj("good")), acks.cb("good"))
    assert await sink.flush(5)
    assert dict(acks.outcomes) == {"bad": DeliveryOutcome.DEAD_LETTERED, "good": DeliveryOutcome.DELIVERED}
    (record,) = [orjson.loads(line) for line in dl.read_bytes().splitlines()]
    # The URL's path may be a secret (url_path_secret, on by default): host and port only.
    assert record["reason"] == f"HTTP 400 from {hook.url}: schema rejected: spec.replicas"
    assert record["message"]["name"] == "bad"
    assert record["key"] == "u-bad"
    assert sink.stats.dead_lettered == 1
    assert len(hook.requests) == 2  # a permanent failure is not retried
    await sink.close()


async def test_a_blocked_webhook_does_not_slow_a_file_sink(hook: Hook, tmp_path: Path) -> None:
    release = asyncio.Event()

    async def respond(request: ReceivedRequest) -> Reply:
        await release.wait()
        return Reply(200)

    hook.respond = respond
    webhook = make(hook, max_in_flight=10)
    fsink = FileSink.from_options("file", {"path": str(tmp_path / "events.jsonl")})
    await webhook.start()
    await fsink.start()
    hook_acks, file_acks = Acks(), Acks()
    events = [event(EventType.ADDED, obj(f"p{i}", rv=str(i))) for i in range(200)]

    async def feed(sink: Any, acks: Acks) -> None:
        for ev in events:
            await sink.deliver(ev, acks.cb(ev.name))

    feeders = [
        asyncio.create_task(feed(webhook, hook_acks), name="feed-webhook"),
        asyncio.create_task(feed(fsink, file_acks), name="feed-file"),
    ]
    assert await fsink.flush(5)
    # The file sink took and acked everything while the webhook holds its window of 10.
    assert len(file_acks.of(DeliveryOutcome.DELIVERED)) == 200
    assert hook_acks.outcomes == []
    assert webhook.stats.in_flight == 10
    assert not feeders[0].done()
    release.set()
    await asyncio.gather(*feeders)
    assert await webhook.flush(5)
    assert len(hook_acks.of(DeliveryOutcome.DELIVERED)) == 200
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["name"] for line in lines] == [f"p{i}" for i in range(200)]
    await webhook.close()
    await fsink.close()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        cwd=d,
    )
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}", cwd=d)
        extra = ["-extfile", "server.ext"] if who == "server" else []
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{who}.crt",
            "-days",
            "2",
            *extra,
            cwd=d,
        )
    return d


async def test_tls_with_custom_ca_and_client_certificate(pki: Path, tmp_path: Path) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    peers: list[str] = []

    async def respond(request: ReceivedRequest) -> Reply:
        cert = request.peer_certificate
        assert cert is not None
        peers.append(dict(x[0] for x in cert["subject"])["commonName"])
        return Reply(200)

    h = await WebhookReceiver(path="", respond=respond, ssl_context=ctx).start()
    try:
        tls = {
            "ca_file": str(pki / "ca.crt"),
            "cert_file": str(pki / "client.crt"),
            "key_file": str(pki / "client.key"),
        }
        sink = make(h, tls=tls)
        acks = Acks()
        await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
        assert await sink.flush(5)
        assert acks.outcomes == [("a", DeliveryOutcome.DELIVERED)]
        assert peers == ["client"]
        await sink.close()
        # Without the client certificate the handshake fails: transient, then dead-lettered here.
        dl = tmp_path / "dl.jsonl"
        nocert = make(
            h,
            tls={"ca_file": str(pki / "ca.crt")},
            retry={"initial": 0.0, "max": 0.0, "max_attempts": 2},
            dead_letter={"kind": "file", "target": str(dl)},
        )
        await nocert.deliver(event(EventType.ADDED, obj("b")), acks.cb("b"))
        assert await nocert.flush(5)
        assert acks.outcomes[-1] == ("b", DeliveryOutcome.DEAD_LETTERED)
        assert orjson.loads(dl.read_bytes())["reason"].startswith("gave up after 2 attempts")
        assert not nocert.healthy()
        await nocert.close()
    finally:
        await h.close()


def test_bad_configuration_is_reported_clearly(tmp_path: Path) -> None:
    with pytest.raises(SinkConfigError, match=r"sink 'hook' \(webhook\): url: must be an absolute http"):
        WebhookSink.from_options("hook", {"url": "ftp://x/"})
    with pytest.raises(SinkConfigError, match=r"url: Field required"):
        WebhookSink.from_options("hook", {})
    with pytest.raises(SinkConfigError, match=r"destination: unknown template field 'bogus'"):
        WebhookSink.from_options("hook", {"url": "http://127.0.0.1:1/", "destination": "/{bogus}"})
    with pytest.raises(SinkConfigError, match=r"batching needs content_mode 'structured'"):
        WebhookSink.from_options(
            "hook", {"url": "http://h/", "content_mode": "binary", "batch": {"max_events": 5}}
        )
    with pytest.raises(
        SinkConfigError, match=r"timeout: Input should be greater than 0; headerz: unknown option"
    ):
        WebhookSink.from_options("hook", {"url": "http://h/", "timeout": 0, "headerz": {}})


async def test_unreadable_secret_file_fails_start(tmp_path: Path) -> None:
    sink = WebhookSink.from_options("hook", {"url": "https://h/", "hmac_secret_file": str(tmp_path / "nope")})
    with pytest.raises(SinkConfigError, match=r"sink 'hook' \(webhook\): hmac_secret_file: cannot read"):
        await sink.start()
    await sink.close()


async def test_messages_hide_url_credentials_and_redirects_are_not_followed(
    hook: Hook, tmp_path: Path
) -> None:
    async def respond(request: ReceivedRequest) -> Reply:
        if request.path == "/moved":
            return Reply(302, headers={"Location": "/elsewhere"})
        return Reply(403, body="forbidden")

    hook.respond = respond
    dl = tmp_path / "dl.jsonl"
    url = hook.url.replace("http://", "http://user:hunter2@") + "/moved?token=abc"
    sink = WebhookSink.from_options("hook", {"url": url, "dead_letter": {"kind": "file", "target": str(dl)}})
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("a")), acks.cb("a"))
    assert await sink.flush(5)
    assert acks.outcomes == [("a", DeliveryOutcome.DEAD_LETTERED)]
    reason = orjson.loads(dl.read_bytes())["reason"]
    assert reason == f"HTTP 302 from {hook.url}"  # no path either: it may hold a token
    assert [r.path for r in hook.requests] == ["/moved"]
    assert hook.requests[0].headers["Authorization"] == "Basic dXNlcjpodW50ZXIy"
    await sink.close()
    with pytest.raises(SinkConfigError) as err:
        WebhookSink.from_options("hook", {"url": "http://u:secret@host:99999/x?t=1"})
    assert "secret" not in str(err.value)
    assert "'http://host'" in str(err.value)


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert parse_retry_after("soon") is None


def test_event_time_fixture_is_stable() -> None:
    assert T0 == 1_700_000_000.25


# ------------------------------------------------------------------------- Standard Webhooks


class _Behind:
    """A wall clock ``lag`` seconds behind: requests it signs look captured and replayed later."""

    def __init__(self, lag: float) -> None:
        self.lag = lag

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time() - self.lag

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@pytest.mark.parametrize("mode", ["structured", "binary", "batch"])
async def test_standard_webhooks_signatures_verify_with_the_reference_library(hook: Hook, mode: str) -> None:
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    answers = iter(["500"])

    async def respond(request: ReceivedRequest) -> Reply:
        return Reply(500 if next(answers, "ok") == "500" else 204)

    hook.respond = respond
    opts: dict[str, Any] = {"hmac_secret": secret}
    if mode == "batch":
        opts["batch"] = {"max_events": 10, "linger": 0.05}
    else:
        opts["content_mode"] = mode
    sink = make(hook, **opts)
    acks = Acks()
    for i in range(3):
        await sink.deliver(event(EventType.ADDED, obj(f"p{i}", rv=str(i))), acks.cb(f"p{i}"))
    assert await sink.flush(10)
    assert len(acks.of(DeliveryOutcome.DELIVERED)) == 3
    verifier = Webhook(secret)
    for rec in hook.requests:
        assert "X-Signature-256" not in rec.headers  # the old scheme only when asked for
        verifier.verify(rec.body, rec.headers, json_parse=False)  # raises unless valid
        with pytest.raises(Exception, match="No matching signature"):
            Webhook(base64.b64encode(b"another key").decode()).verify(rec.body, rec.headers)
        tampered = {**rec.headers, "webhook-id": "other-id"}
        with pytest.raises(Exception, match="No matching signature"):
            verifier.verify(rec.body, tampered)
    # The failed first request and its retry carry the same id (a receiver dedups on it).
    if mode != "batch":  # (a batch's events may be retried in other batches: other ids)
        first = hook.requests[0]
        retries = [r for r in hook.requests[1:] if r.body == first.body]
        assert retries
        assert {r.headers["webhook-id"] for r in retries} == {first.headers["webhook-id"]}
        ids = {r.headers["webhook-id"] for r in hook.accepted}
        expected = {orjson.loads(r.body)["id"] for r in hook.accepted} if mode == "structured" else {
            r.headers["ce-id"] for r in hook.accepted}
        assert ids == expected
    await sink.close()


async def test_a_replayed_request_is_rejected_by_the_receiver(hook: Hook) -> None:
    secret = "a plain secret"
    sink = WebhookSink(name="hook", options=WebhookOptions(url=f"{hook.url}/events", hmac_secret=secret),
                       clock=_Behind(lag=600))
    acks = Acks()
    await sink.deliver(event(EventType.ADDED, obj("p")), acks.cb("p"))
    assert await sink.flush(5)
    (rec,) = hook.accepted
    with pytest.raises(Exception, match="too old"):
        Webhook(secret.encode()).verify(rec.body, rec.headers)
    await sink.close()


async def test_a_whsec_secret_must_be_base64() -> None:
    sink = WebhookSink.from_options("hook", {"url": "https://h/", "hmac_secret": "whsec_not base64!"})
    with pytest.raises(SinkConfigError, match=r"\(webhook\): hmac_secret: a whsec_ secret must be"):
        await sink.start()


def test_display_url_keeps_the_path_only_when_told() -> None:
    from sinks.webhook import WebhookOptions, display_url

    url = "https://u:p@hooks.example.com:8443/services/T000/B000/XXXX?sig=abc#f"
    assert display_url(url) == "https://hooks.example.com:8443"
    assert display_url(url, keep_path=True) == "https://hooks.example.com:8443/services/T000/B000/XXXX"
    assert WebhookOptions(url=url).url_path_secret is True
