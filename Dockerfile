# syntax=docker/dockerfile:1
# kube-event-bridge: multi-stage build. The builder compiles wheels; the final image holds only the
# virtual environment, runs as a non-root user and works with a read-only root filesystem
# (writable state goes to /var/lib/kube-event-bridge and /tmp, mounted as volumes by the chart).

ARG PYTHON_VERSION=3.11

# The base image is pinned by tag only: pin it by digest where a registry is reachable
# (docs/operations.md, "Upgrading the chart": the image).
FROM python:${PYTHON_VERSION}-slim-bookworm AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH="/opt/venv/bin:${PATH}"
COPY pyproject.toml README.md constraints.txt ./
COPY bridge ./bridge
COPY sinks ./sinks
# The exact versions CI tested (constraints.txt, from scripts/lock); pip and setuptools leave the
# virtual environment, which needs neither at run time.
RUN pip install --no-cache-dir --constraint constraints.txt . \
    && python -m compileall -q /opt/venv \
    && pip uninstall --yes --quiet setuptools pip

FROM python:${PYTHON_VERSION}-slim-bookworm
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kube-event-bridge" \
      org.opencontainers.image.description="Forwards Kubernetes object changes to Kafka, NATS and webhooks as CloudEvents" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kube-event-bridge/kube-event-bridge"
ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KEB_CHECKPOINT__DIRECTORY=/var/lib/kube-event-bridge/checkpoints
RUN groupadd --system --gid 65532 bridge \
    && useradd --system --uid 65532 --gid bridge --home-dir /var/lib/kube-event-bridge --shell /usr/sbin/nologin bridge \
    && install -d -o bridge -g bridge -m 0750 /var/lib/kube-event-bridge
COPY --from=builder /opt/venv /opt/venv
USER 65532:65532
WORKDIR /var/lib/kube-event-bridge
EXPOSE 8080
ENTRYPOINT ["kube-event-bridge"]
CMD ["run", "--config", "/etc/kube-event-bridge/config.yaml"]
