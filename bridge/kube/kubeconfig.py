"""Where the bridge finds its API server and its credentials.

The ``kubernetes`` package knows every way a kubeconfig can authenticate (tokens, token files, exec
credential plugins, client certificates, auth providers) and how a Pod finds its service account, so
this module lets it do the parsing and turns its result into two small things the HTTP client needs:
a :class:`ClusterConfig` (where, and how to trust it) and a :class:`TokenSource` (what to put in the
``Authorization`` header, refreshed as credentials rotate).

Credentials never leave these objects except as that header value: no ``repr``, log line or error
message here contains a token or key material. Errors from a bad kubeconfig are
:class:`~bridge.errors.ConfigurationError` naming the file and the problem.
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from bridge.clock import Clock, RealClock
from bridge.errors import ConfigurationError

__all__ = [
    "DEFAULT_KUBECONFIG",
    "SERVICE_ACCOUNT_CA_FILE",
    "SERVICE_ACCOUNT_TOKEN_FILE",
    "ClusterConfig",
    "FileTokenSource",
    "KubeconfigTokenSource",
    "LoadedConfig",
    "StaticTokenSource",
    "TokenSource",
    "in_cluster_available",
    "load_in_cluster",
    "load_kubeconfig",
]

_log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
DEFAULT_KUBECONFIG = "~/.kube/config"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """How to reach and trust one API server. Holds file paths, never key material."""

    server: str
    """Base URL, e.g. ``https://10.0.0.1:443`` (a path prefix is kept)."""
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    """False = insecure-skip-tls-verify."""
    tls_server_name: str | None = None
    source: str = ""
    """Where this came from, for messages: ``kubeconfig /path (context c)`` or ``in-cluster``."""


class TokenSource(Protocol):
    """Produces the ``Authorization`` header value for each request."""

    async def authorization(self, *, force_refresh: bool = False) -> str | None:
        """The header value (``Bearer …``), or None for no header. ``force_refresh`` is set after
        the server answered 401: the source should re-read or re-run whatever produced it."""


class StaticTokenSource:
    """A bearer token given directly."""

    __slots__ = ("_header",)

    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token.strip()}"

    async def authorization(self, *, force_refresh: bool = False) -> str | None:
        return self._header

    def __repr__(self) -> str:
        return "StaticTokenSource(<redacted>)"


class FileTokenSource:
    """A token kept in a file that something else rotates (a projected service-account token).

    The file is re-read at most every ``refresh_interval`` seconds of ``clock`` time, and at once when
    the server rejected the current token (401), which is what client-go's cached token source does.
    """

    def __init__(self, *, path: str, refresh_interval: float = 60.0, clock: Clock | None = None) -> None:
        self._path = path
        self._refresh_interval = refresh_interval
        self._clock: Clock = clock or RealClock()
        self._header: str | None = None
        self._read_at: float | None = None
        self.reads = 0
        """How many times the file was read (for tests and metrics)."""

    @property
    def path(self) -> str:
        return self._path

    def _read(self) -> str:
        try:
            with open(self._path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise ConfigurationError(
                f"service-account token file {self._path}: cannot be read ({e.strerror or e})"
            ) from e
        if not token:
            raise ConfigurationError(f"service-account token file {self._path} is empty")
        self.reads += 1
        return f"Bearer {token}"

    async def authorization(self, *, force_refresh: bool = False) -> str | None:
        now = self._clock.now()
        stale = self._read_at is None or now - self._read_at >= self._refresh_interval
        if self._header is None or stale or force_refresh:
            try:
                self._header = self._read()
            except ConfigurationError:
                # A rotation in progress may leave the file briefly missing or empty: keep using the
                # token we have rather than failing every request; with no token yet, fail.
                if self._header is None:
                    raise
                _log.warning("token file %s unreadable; keeping the previous token", self._path)
            self._read_at = now
        return self._header

    def __repr__(self) -> str:
        return f"FileTokenSource(path={self._path!r}, refresh_interval={self._refresh_interval})"


class KubeconfigTokenSource:
    """Credentials as the ``kubernetes`` package loaded them from a kubeconfig.

    Its refresh hook re-runs exec plugins / auth providers when their credential expires; after a 401
    the whole kubeconfig is reloaded (re-reading token files and re-running the exec plugin). Both can
    block (subprocesses, files), so they run in a worker thread.
    """

    def __init__(self, *, configuration: Any, reload: Callable[[], Any] | None = None) -> None:
        self._configuration = configuration
        self._reload = reload
        self._lock = asyncio.Lock()

    @staticmethod
    def _header_of(configuration: Any) -> str | None:
        value = configuration.api_key.get("BearerToken") or configuration.api_key.get("authorization")
        # Token files often end with a newline, which the kubernetes package keeps.
        return str(value).strip() if value else None

    def _refresh_blocking(self, force: bool) -> str | None:
        if force and self._reload is not None:
            self._configuration = self._reload()
        hook = getattr(self._configuration, "refresh_api_key_hook", None)
        if hook is not None:
            try:
                hook(self._configuration)
            except Exception as e:  # the package raises whatever its auth provider raised
                # Only the type: the provider's message may quote its output, credentials included.
                raise ConfigurationError(
                    f"kubeconfig credentials could not be refreshed ({type(e).__name__}); check the "
                    "user's exec plugin or auth provider"
                ) from e
        return self._header_of(self._configuration)

    async def authorization(self, *, force_refresh: bool = False) -> str | None:
        hook = getattr(self._configuration, "refresh_api_key_hook", None)
        if hook is None and not force_refresh:
            return self._header_of(self._configuration)
        async with self._lock:
            return await asyncio.to_thread(self._refresh_blocking, force_refresh)

    def __repr__(self) -> str:
        return "KubeconfigTokenSource(<redacted>)"


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A cluster and the credentials for it."""

    cluster: ClusterConfig
    token_source: TokenSource | None


# --------------------------------------------------------------------------------------------------
# kubeconfig


def _kubeconfig_paths(path: str | None) -> list[str]:
    raw = path if path is not None else os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return [os.path.expanduser(p) for p in raw.split(os.pathsep) if p]


def _names(items: Any) -> list[str]:
    if not isinstance(items, list):
        return []
    return [str(i["name"]) for i in items if isinstance(i, dict) and "name" in i]


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise ConfigurationError(f"kubeconfig {path}: file does not exist") from e
    except OSError as e:
        raise ConfigurationError(f"kubeconfig {path}: cannot be read ({e.strerror or e})") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        # The YAML error's own text quotes the offending line, which may hold a token: report only
        # the problem and the position.
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigurationError(f"kubeconfig {path}: not valid YAML: {problem}{where}") from e
    if data is None:
        raise ConfigurationError(f"kubeconfig {path}: the file is empty")
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"kubeconfig {path}: expected a mapping with clusters, contexts and users, "
            f"found a {type(data).__name__}"
        )
    for key in ("clusters", "contexts", "users"):
        value = data.get(key)
        if value is not None and not isinstance(value, list):
            raise ConfigurationError(f"kubeconfig {path}: '{key}' must be a list")
        for entry in value or []:
            if not isinstance(entry, dict) or "name" not in entry:
                raise ConfigurationError(f"kubeconfig {path}: every entry of '{key}' needs a 'name'")
    return data


def _validate(paths: list[str], context: str | None) -> tuple[str, str]:
    """Checks what the ``kubernetes`` loader would only report obscurely; returns (label, context)."""
    existing = [p for p in paths if os.path.exists(p)]
    if not existing:
        raise ConfigurationError(
            f"kubeconfig {os.pathsep.join(paths)}: file does not exist "
            "(set --kubeconfig / KUBECONFIG, or run in a cluster)"
        )
    merged: dict[str, list[Any]] = {"clusters": [], "contexts": [], "users": []}
    current: str | None = None
    for p in existing:
        data = _read_yaml(p)
        for key, entries in merged.items():
            entries.extend(data.get(key) or [])
        if current is None and data.get("current-context"):
            current = str(data["current-context"])
    label = existing[0] if len(existing) == 1 else os.pathsep.join(existing)
    chosen = context or current
    contexts = _names(merged["contexts"])
    if not chosen:
        raise ConfigurationError(
            f"kubeconfig {label}: no current-context and no context chosen "
            f"(available contexts: {', '.join(contexts) or 'none'})"
        )
    entry = next((c for c in merged["contexts"] if c.get("name") == chosen), None)
    if entry is None:
        raise ConfigurationError(
            f"kubeconfig {label}: context {chosen!r} not found "
            f"(available contexts: {', '.join(contexts) or 'none'})"
        )
    ctx = entry.get("context")
    if not isinstance(ctx, dict) or not ctx.get("cluster"):
        raise ConfigurationError(f"kubeconfig {label}: context {chosen!r} names no cluster")
    cluster_name = str(ctx["cluster"])
    cluster = next((c for c in merged["clusters"] if c.get("name") == cluster_name), None)
    if cluster is None:
        raise ConfigurationError(
            f"kubeconfig {label}: context {chosen!r} refers to cluster {cluster_name!r}, which is not "
            f"defined (clusters: {', '.join(_names(merged['clusters'])) or 'none'})"
        )
    body = cluster.get("cluster")
    if not isinstance(body, dict) or not body.get("server"):
        raise ConfigurationError(f"kubeconfig {label}: cluster {cluster_name!r} has no 'server' URL")
    server = str(body["server"])
    if not server.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"kubeconfig {label}: cluster {cluster_name!r} server {server!r} must start with "
            "http:// or https://"
        )
    user_name = ctx.get("user")
    if user_name and not any(u.get("name") == user_name for u in merged["users"]):
        raise ConfigurationError(
            f"kubeconfig {label}: context {chosen!r} refers to user {user_name!r}, which is not defined"
        )
    return label, chosen


def _load_configuration(paths: list[str], context: str, label: str) -> Any:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.pathsep.join(paths),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except k8s_config.ConfigException as e:
        raise ConfigurationError(f"kubeconfig {label}: {e}") from e
    except (ValueError, TypeError, KeyError, OSError, binascii.Error) as e:
        raise ConfigurationError(
            f"kubeconfig {label} (context {context!r}): invalid content ({type(e).__name__})"
        ) from e
    return configuration


def load_kubeconfig(path: str | None = None, context: str | None = None) -> LoadedConfig:
    """Loads a kubeconfig (``path``, else ``$KUBECONFIG``, else ``~/.kube/config``; a list separated
    by ``os.pathsep`` is merged as kubectl does) for ``context`` (default: current-context).

    Blocking (it may run an exec credential plugin): call it before the loop starts or in a thread.
    """
    paths = _kubeconfig_paths(path)
    label, chosen = _validate(paths, context)
    configuration = _load_configuration(paths, chosen, label)
    cluster = ClusterConfig(
        server=str(configuration.host).rstrip("/"),
        ca_file=configuration.ssl_ca_cert or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        verify=bool(configuration.verify_ssl),
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
        source=f"kubeconfig {label} (context {chosen})",
    )
    has_credentials = bool(KubeconfigTokenSource._header_of(configuration)) or (
        getattr(configuration, "refresh_api_key_hook", None) is not None
    )
    token_source: TokenSource | None = None
    if has_credentials:
        token_source = KubeconfigTokenSource(
            configuration=configuration,
            reload=lambda: _load_configuration(paths, chosen, label),
        )
    return LoadedConfig(cluster=cluster, token_source=token_source)


# --------------------------------------------------------------------------------------------------
# in-cluster


def in_cluster_available(
    environ: Mapping[str, str] | None = None, token_file: str = SERVICE_ACCOUNT_TOKEN_FILE
) -> bool:
    """True when the process runs in a Pod with a service account mounted."""
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(token_file)


def load_in_cluster(
    *,
    token_file: str = SERVICE_ACCOUNT_TOKEN_FILE,
    ca_file: str = SERVICE_ACCOUNT_CA_FILE,
    environ: Mapping[str, str] | None = None,
    refresh_interval: float = 60.0,
    clock: Clock | None = None,
) -> LoadedConfig:
    """The service account of the Pod: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``,
    trusted through ``ca_file``, authenticated by the token in ``token_file``, re-read as it rotates."""
    from kubernetes import client as k8s_client
    from kubernetes.config import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    env = dict(os.environ if environ is None else environ)
    loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=token_file, cert_filename=ca_file, try_refresh_token=False, environ=env
    )
    configuration = k8s_client.Configuration()
    try:
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except ConfigException as e:
        raise ConfigurationError(
            f"in-cluster configuration: {e} (token {token_file}, CA {ca_file}, "
            "KUBERNETES_SERVICE_HOST/PORT)"
        ) from e
    cluster = ClusterConfig(
        server=str(configuration.host).rstrip("/"),
        ca_file=configuration.ssl_ca_cert,
        source="in-cluster service account",
    )
    source = FileTokenSource(path=token_file, refresh_interval=refresh_interval, clock=clock)
    return LoadedConfig(cluster=cluster, token_source=source)
