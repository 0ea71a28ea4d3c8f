"""The API-server simulator: kube-apiserver's HTTP contract over :class:`~bridge.sim.store.ObjectStore`.

No kube-apiserver binary can run where the bridge is built and tested, so this serves the part of the
contract the bridge, kubectl and the official ``kubernetes`` client use: discovery (aggregated too),
OpenAPI, CRUD with every patch type and server-side apply, dry runs, tables, scale, access reviews,
paginated lists with consistent snapshots and resourceVersion semantics, watches as chunked JSON lines
with bookmarks, timeouts and WatchList, 410 Expired exactly as the real server sends it, bearer-token
auth and RBAC-like refusals, plus fault injection and an admin endpoint (``/_sim/...``) so tests can
break things on purpose.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
import yaml
from aiohttp import web

from bridge.clock import Clock
from bridge.jsonbounds import MAX_DEPTH, MAX_OBJECT_BYTES, exceeds_depth
from bridge.kube.labels import SelectorError
from bridge.sim.apf import FlowControl, flow_of
from bridge.sim.faults import FaultSpec, FaultState
from bridge.sim.managed import FieldOwner
from bridge.sim.metadata_view import accepts_partial, partial, partial_list
from bridge.sim.openapi_proto import PROTOBUF_V2, PROTOBUF_V2_CONTENT_TYPE, encode_document
from bridge.sim.resources import ResourceType
from bridge.sim.status import (
    BadRequest,
    Conflict,
    Expired,
    Invalid,
    NotFound,
    SimStatusError,
    TooLargeResourceVersion,
)
from bridge.sim.store import (
    DEFAULT_HISTORY_SIZE,
    DEFAULT_WATCHER_BUFFER,
    Change,
    ObjectStore,
    PatchType,
    Watcher,
    WatchFilter,
    apply_json_patch,
    json_merge_patch,
)
from bridge.sim.strategic import strategic_merge_patch
from bridge.sim.tables import accepts_table, table

KubeObject = dict[str, Any]
"""The simulator's objects: JSON dicts it owns and changes (the bridge's objects are read-only)."""

__all__ = ["DEFAULT_WATCH_TIMEOUT", "INITIAL_EVENTS_END_ANNOTATION", "Simulator"]

_log = logging.getLogger(__name__)

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
DEFAULT_WATCH_TIMEOUT = 1800.0
"""Seconds a watch without ``timeoutSeconds`` stays open (kube-apiserver: min-request-timeout)."""

_EXPIRED_CONTINUE_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a "
    "new list without the continue parameter, or use the continue token in this response to retrieve "
    "the remainder of the results. Continuing with the provided token results in an inconsistent list "
    "- objects that were created, modified, or deleted between the time the first chunk was returned "
    "and now may show up in the list."
)
_JSON = "application/json"
_TYPE_FIELDS = frozenset({"apiVersion", "kind"})
_BATCH = 256
"""Most watch events written as one chunk."""
_STALL_POLL = 0.05
"""Seconds between looks at the ``watch_stall`` fault while a watch is held silent."""


_AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@dataclass(frozen=True, slots=True)
class _Writer:
    """The write options of one request: ``dryRun``, ``fieldManager``, ``force``, ``fieldValidation``."""

    dry_run: bool
    manager: str
    force: bool
    validation: str

    @classmethod
    def parse(cls, request: web.Request) -> _Writer:
        query = request.query
        dry = query.getall("dryRun", [])
        for value in dry:
            if value != "All":
                raise Invalid(f'dryRun: Unsupported value: "{value}": supported values: "All"')
        manager = query.get("fieldManager")
        if manager is None:
            # kube-apiserver's default: the user agent up to its first "/".
            manager = request.headers.get("User-Agent", "").split("/", 1)[0][:128]
        validation = query.get("fieldValidation") or "Warn"
        if validation not in ("Ignore", "Warn", "Strict"):
            raise BadRequest(f"fieldValidation: invalid value {validation!r}: must be one of Ignore, Warn or "
                             "Strict")
        return cls(dry_run=bool(dry), manager=manager, force=_bool_param(query.get("force")),
                   validation=validation)

    def owner(self, rt: ResourceType, subresource: str | None) -> FieldOwner:
        return FieldOwner(manager=self.manager, api_version=rt.api_version, subresource=subresource)


@dataclass(frozen=True, slots=True)
class _Target:
    """A parsed API path: the resource, its scope, and the object/subresource when given."""

    resource: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    legacy_watch: bool = False


def _json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=_JSON, headers=headers)


def _wants_aggregated(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return any("as=APIGroupDiscoveryList" in part and "v=v2;" in part + ";" and "apidiscovery.k8s.io" in part
               for part in accept.split(","))


def _status_response(err: SimStatusError) -> web.Response:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return _json_response(err.status(), status=err.code, headers=headers)


def _bool_param(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _int_param(name: str, value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise BadRequest(f"invalid value for {name}: {value!r} is not an integer") from exc


def _encode_continue(rv: int, start: tuple[str, str]) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(start)})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _check_bounds(raw: bytes) -> None:
    """The simulator's own decoding is bounded as the bridge's (:mod:`bridge.jsonbounds`): a body
    nested deeper, or larger, is refused before it is decoded (the store copies objects with orjson,
    whose encoder stops at 254 levels)."""
    if len(raw) > MAX_OBJECT_BYTES:
        raise BadRequest(f"the request body is larger than {MAX_OBJECT_BYTES} bytes")
    if exceeds_depth(raw, MAX_DEPTH):
        raise BadRequest(f"the request body is nested deeper than {MAX_DEPTH} levels")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        rv = int(data["rv"])
        ns, name = data["start"]
        return rv, (str(ns), str(name))
    except (binascii.Error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BadRequest("continue key is not valid: expected a token from a previous list") from exc


def _list_items(rt: ResourceType, objects: list[KubeObject]) -> list[KubeObject]:
    """Items as a List carries them: built-in types without apiVersion/kind, CRD objects unchanged."""
    if rt.crd:
        return objects
    return [{k: v for k, v in o.items() if k not in _TYPE_FIELDS} for o in objects]


def _without_directives(node: Any) -> Any:
    """A patch without its strategic-merge directives (``$patch``, ``$setElementOrder/…``)."""
    if isinstance(node, dict):
        return {k: _without_directives(v) for k, v in node.items() if not k.startswith("$")}
    if isinstance(node, list):
        return [_without_directives(v) for v in node]
    return node


def _scale_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    labels = ((spec.get("selector") or {}).get("matchLabels") or {})
    return {
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in meta},
        "spec": {"replicas": int(spec.get("replicas", 1))},
        "status": {"replicas": int((obj.get("status") or {}).get("replicas", 0)),
                   "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))},
    }


def _item_key(item: tuple[tuple[str, str], Any]) -> tuple[str, str]:
    return item[0]


def _event_line(kind: str, obj_json: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + obj_json + b"}\n"


class Simulator:
    """A kube-apiserver stand-in on a real socket.

    ``faults`` is the initial :class:`~bridge.sim.faults.FaultSpec` (or a mapping of its fields);
    ``crds`` are CRDs to serve from the start (``ResourceType`` or ``{group, version, plural, kind,
    namespaced}``); ``token`` makes every API request require ``Authorization: Bearer <token>``;
    ``forbidden`` lists ``(group, plural)`` pairs answered with 403 (every verb) and ``denied``
    ``(verb, group, plural)`` triples (that verb only: a missing RBAC rule); SelfSubjectAccessReviews
    answer both; ``watch_list=False`` rejects
    ``sendInitialEvents`` like a server without the WatchList feature; ``too_large_wait`` is how long a
    request for a future resourceVersion waits before its 504; ``cache_pagination=False`` makes a list
    at resourceVersion "0" ignore ``limit`` and answer everything in one page, as kube-apiserver's
    watch cache did before it could paginate (client-go's reflector then stops paginating).
    ``namespaces`` exist from the start (creating in any other namespace answers 404, as a real server
    does, until it is created). ``flow_control`` answers a client that has more requests executing
    than it allows with 429 and ``Retry-After``, as API Priority and Fairness does
    (:mod:`bridge.sim.apf`).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        history_size: int = DEFAULT_HISTORY_SIZE,
        bookmark_interval: float = 60.0,
        too_large_wait: float = 1.0,
        default_watch_timeout: float = DEFAULT_WATCH_TIMEOUT,
        faults: FaultSpec | Mapping[str, Any] | None = None,
        watch_list: bool = True,
        crds: Iterable[ResourceType | Mapping[str, Any]] = (),
        token: str | None = None,
        forbidden: Iterable[tuple[str, str]] = (),
        denied: Iterable[tuple[str, str, str]] = (),
        watcher_buffer: int = DEFAULT_WATCHER_BUFFER,
        cache_pagination: bool = True,
        clock: Clock | None = None,
        namespaces: Iterable[str] = ("default", "kube-system"),
        flow_control: FlowControl | None = None,
    ) -> None:
        if bookmark_interval <= 0:
            raise ValueError("bookmark_interval must be positive")
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.too_large_wait = too_large_wait
        self.default_watch_timeout = default_watch_timeout
        self.watch_list = watch_list
        self.cache_pagination = cache_pagination
        self.token = token
        self.forbidden: set[tuple[str, str]] = set(forbidden)
        self.denied: set[tuple[str, str, str]] = set(denied)
        self.store = ObjectStore(history_size=history_size, watcher_buffer=watcher_buffer, clock=clock,
                                 initial_namespaces=namespaces)
        self.faults = FaultState(faults)
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests served per verb (list, watch, get, create, update, patch, delete, discovery)."""
        self.flow_control = flow_control
        self.bytes_sent = 0
        """Bytes of the API's answers (bodies and watch streams), for the harness."""
        self.requests_received = 0
        """Every API request, answered or refused (429s included)."""
        for crd in crds:
            self.register_crd(crd)
        self.shutdown_timeout = 2.0
        """Seconds :meth:`stop` lets a request still being answered finish (open watches are closed
        first, so they never wait it out)."""
        self._runner: web.AppRunner | None = None
        self._openapi_cache: tuple[tuple[ResourceType, ...], dict[str, dict[str, Any]]] | None = None
        self._stopping = asyncio.Event()
        self._url: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``); only after :meth:`start`."""
        if self._url is None:
            raise RuntimeError("the simulator is not started")
        return self._url

    async def start(self) -> str:
        """Binds the socket and serves; returns the base URL."""
        if self._runner is not None:
            return self.url
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api", self._handle_api)
        app.router.add_route("*", "/api/{tail:.*}", self._handle_api)
        app.router.add_route("*", "/apis", self._handle_api)
        app.router.add_route("*", "/apis/{tail:.*}", self._handle_api)
        app.router.add_get("/version", self._handle_version)
        app.router.add_get("/openapi/v2", self._handle_openapi_v2)
        app.router.add_get("/openapi/v3", self._handle_openapi_v3)
        app.router.add_get("/openapi/v3/{tail:.*}", self._handle_openapi_v3)
        app.router.add_get("/healthz", self._handle_health)
        app.router.add_get("/readyz", self._handle_health)
        app.router.add_get("/livez", self._handle_health)
        app.router.add_get("/_sim/faults", self._admin_get_faults)
        app.router.add_post("/_sim/faults", self._admin_set_faults)
        app.router.add_post("/_sim/compact", self._admin_compact)
        app.router.add_post("/_sim/crds", self._admin_crds)
        app.router.add_post("/_sim/expire-watches", self._admin_expire_watches)
        app.router.add_get("/_sim/state", self._admin_state)
        self._stopping = asyncio.Event()
        # handler_cancellation: a client that goes away cancels its handler, so an idle watch whose
        # reader disconnected is unregistered at once instead of at its next write.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout,
                               handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        address = runner.addresses[0]
        self.port = int(address[1])
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self._url = f"http://{host}:{self.port}"
        return self._url

    async def stop(self) -> None:
        """Closes every watch at once, then the server. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._stopping.set()
        self.store.close_watchers("server stopping")
        await runner.cleanup()

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # ------------------------------------------------------------------ python API for tests

    def register_crd(self, crd: ResourceType | Mapping[str, Any]) -> ResourceType:
        """Serves a CRD from now on (discovery included)."""
        if isinstance(crd, ResourceType):
            rt = dataclasses.replace(crd, crd=True)
        else:
            rt = ResourceType.from_mapping(crd)
        return self.store.register(rt)

    def compact(self) -> int:
        """Compacts the history now; returns the compaction resourceVersion."""
        return self.store.compact()

    def expire_watches(self) -> int:
        """Sends an ERROR 410 Expired event into every open watch and closes it; returns how many."""
        status = Expired("The resourceVersion for the provided watch is too old.").status()
        return self.store.close_watchers("expired by fault injection", error=status)

    def set_faults(self, spec: FaultSpec | Mapping[str, Any] | None = None, **changes: Any) -> FaultSpec:
        """Replaces the fault spec (``spec``) or amends some of its fields (keywords)."""
        if spec is not None:
            self.faults.replace(spec)
        return self.faults.amend(changes) if changes else self.faults.spec

    def write_kubeconfig(self, path: str | Path, *, context: str = "sim", namespace: str = "default") -> Path:
        """Writes a kubeconfig (one cluster, user and context) pointing at this simulator."""
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": user}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context,
                                                       "namespace": namespace}}],
            "current-context": context,
            "preferences": {},
        }
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        out.chmod(0o600)
        return out

    def state(self) -> dict[str, Any]:
        """What ``GET /_sim/state`` answers."""
        store = self.store
        return {
            "resourceVersion": str(store.resource_version),
            "objects": store.counts(),
            "compacted": {rt.qualified: store.compacted_rv(rt) for rt in store.registry.all()},
            "watchers": store.watcher_count(),
            "requests": dict(self.requests),
            "requests_received": self.requests_received,
            "bytes_sent": self.bytes_sent,
            "flow_control": None if self.flow_control is None else self.flow_control.describe(),
            "faults": self.faults.describe(),
            "resources": [rt.qualified for rt in store.registry.all()],
        }

    # ------------------------------------------------------------------ admin endpoint

    async def _admin_get_faults(self, request: web.Request) -> web.Response:
        return _json_response(self.faults.describe())

    async def _admin_set_faults(self, request: web.Request) -> web.Response:
        """Body: fault fields to change; ``"reset": true`` starts from a healthy spec;
        ``"expire_watches": true`` also sends ERROR 410 into the open watches now."""
        try:
            body = await self._read_optional(request) or {}
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object of fault fields")
            changes = dict(body)
            reset = bool(changes.pop("reset", False))
            expire = bool(changes.pop("expire_watches", False))
            compact = bool(changes.pop("compact", False))
            try:
                if reset:
                    self.faults.replace(changes)
                elif changes:
                    self.faults.amend(changes)
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
            if compact:
                self.compact()
            expired = self.expire_watches() if expire else 0
        except SimStatusError as err:
            return _status_response(err)
        return _json_response({**self.faults.describe(), "watches_expired": expired})

    async def _admin_compact(self, request: web.Request) -> web.Response:
        return _json_response({"resourceVersion": str(self.compact())})

    async def _admin_expire_watches(self, request: web.Request) -> web.Response:
        return _json_response({"watches_expired": self.expire_watches()})

    async def _admin_crds(self, request: web.Request) -> web.Response:
        """Body: one CRD ``{group, version, plural, kind, namespaced}`` or a list of them."""
        try:
            body = await self._read_body(request)
            specs = body if isinstance(body, list) else [body]
            registered: list[dict[str, Any]] = []
            for spec in specs:
                if not isinstance(spec, dict):
                    raise BadRequest("a CRD must be a JSON object")
                try:
                    rt = self.register_crd(spec)
                except ValueError as exc:
                    raise BadRequest(str(exc)) from exc
                registered.append({"group": rt.group, "version": rt.version, "plural": rt.plural,
                                   "kind": rt.kind, "namespaced": rt.namespaced})
        except SimStatusError as err:
            return _status_response(err)
        return _json_response({"registered": registered}, status=201)

    async def _admin_state(self, request: web.Request) -> web.Response:
        return _json_response(self.state())

    # ------------------------------------------------------------------ plumbing

    def _check_auth(self, request: web.Request) -> None:
        if self.token is None:
            return
        if request.headers.get("Authorization", "") != f"Bearer {self.token}":
            raise SimStatusError("Unauthorized", code=401, reason="Unauthorized")

    async def _pause(self, seconds: float) -> None:
        """Sleeps, but returns at once when the simulator stops."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _handle_version(self, request: web.Request) -> web.Response:
        try:
            self._check_auth(request)
        except SimStatusError as err:
            return _status_response(err)
        return _json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0-kube-event-bridge-sim",
                               "platform": "linux/amd64"})

    def _openapi_types(self) -> list[ResourceType]:
        return [rt for rt in self.store.registry.all() if not rt.virtual]

    async def _handle_openapi_v2(self, request: web.Request) -> web.Response:
        """The Swagger 2.0 document: protobuf when asked for (kubectl), JSON otherwise."""
        try:
            self._check_auth(request)
        except SimStatusError as err:
            return _status_response(err)
        doc = self.store.schemas.v2(self._openapi_types())
        if PROTOBUF_V2 in request.headers.get("Accept", ""):
            return web.Response(body=encode_document(doc), headers={"Content-Type": PROTOBUF_V2_CONTENT_TYPE})
        return _json_response(doc)

    def _openapi_v3_docs(self) -> dict[str, dict[str, Any]]:
        types = self._openapi_types()
        key = tuple(types)
        cached = self._openapi_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        by_gv: dict[str, list[ResourceType]] = {}
        for rt in types:
            path = f"api/{rt.version}" if not rt.group else f"apis/{rt.group}/{rt.version}"
            by_gv.setdefault(path, []).append(rt)
        docs = {path: self.store.schemas.v3(rts) for path, rts in by_gv.items()}
        self._openapi_cache = (key, docs)
        return docs

    async def _handle_openapi_v3(self, request: web.Request) -> web.Response:
        """``/openapi/v3``: the index of group-versions; ``/openapi/v3/<gv>``: one document."""
        try:
            self._check_auth(request)
            docs = self._openapi_v3_docs()
            tail = request.match_info.get("tail", "").strip("/")
            if not tail:
                return _json_response({"paths": {
                    path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={self.store.schemas.v3_hash(doc)}"}
                    for path, doc in docs.items()}})
            doc = docs.get(tail)
            if doc is None:
                raise NotFound("the server could not find the requested resource")
        except SimStatusError as err:
            return _status_response(err)
        return _json_response(doc, headers={"Cache-Control": "public, immutable", "Etag": '"'
                                            + self.store.schemas.v3_hash(doc) + '"'})

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        self.requests_received += 1
        response: web.StreamResponse
        watch = request.query.get("watch") in ("true", "1")
        if self.flow_control is None or watch:
            # A watch holds no seat once it streams (module docs of bridge.sim.apf).
            response = await self._handle_api_request(request)
        else:
            try:
                async with self.flow_control.seat(flow_of(request.headers)):
                    response = await self._handle_api_request(request)
            except SimStatusError as err:
                response = _status_response(err)
        if isinstance(response, web.Response) and isinstance(response.body, bytes | bytearray):
            self.bytes_sent += len(response.body)
        return response

    async def _handle_api_request(self, request: web.Request) -> web.StreamResponse:
        try:
            self._check_auth(request)
            parts = [p for p in request.path.split("/") if p]
            if parts in (["api"], ["apis"]) and _wants_aggregated(request) and request.method == "GET":
                self.requests["discovery"] += 1
                return web.Response(body=orjson.dumps(self._aggregated(parts[0])),
                                    headers={"Content-Type": _AGGREGATED, "Vary": "Accept"})
            discovery = self._discovery(parts)
            if discovery is not None:
                if request.method != "GET":
                    raise SimStatusError("the server does not allow this method on the requested resource",
                                         code=405, reason="MethodNotAllowed")
                self.requests["discovery"] += 1
                return _json_response(discovery)
            target = self._parse_target(parts)
            verb = self._verb(request, target)
            self._check_forbidden(target, verb)
            injected = self.faults.take_error(is_watch=verb == "watch", is_list=verb == "list")
            await self._pause(self.faults.spec.delay)
            if target.resource.group == "coordination.k8s.io" and target.resource.plural == "leases":
                await self._pause(self.faults.lease_delay_for(request.headers.get("User-Agent", "")))
            if injected is not None:
                reason = {429: "TooManyRequests", 500: "InternalError",
                          503: "ServiceUnavailable"}[injected.code]
                message = {429: "Too many requests, please try again later.",
                           500: "Internal error injected by the simulator",
                           503: "The server is currently unable to handle the request"}[injected.code]
                raise SimStatusError(message, code=injected.code, reason=reason,
                                     retry_after=injected.retry_after)
            self.requests[verb] += 1
            return await self._serve(request, target, verb)
        except SimStatusError as err:
            return _status_response(err)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # A bug in the simulator: answer as kube-apiserver does (500 Status) and say so in the log.
            _log.exception("simulator failed on %s %s", request.method, request.path)
            return _status_response(SimStatusError(f"simulator internal error: {exc!r}", code=500,
                                                   reason="InternalError"))

    def _discovery(self, parts: Sequence[str]) -> dict[str, Any] | None:
        registry = self.store.registry
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]}
        if parts == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1",
                    "groups": [self._api_group(g, vs) for g, vs in registry.groups().items()]}
        if len(parts) == 2 and parts[0] == "apis":
            versions = registry.groups().get(parts[1])
            if versions is None:
                raise NotFound("the server could not find the requested resource")
            return {"kind": "APIGroup", "apiVersion": "v1", **self._api_group(parts[1], versions)}
        if parts == ["api", "v1"]:
            return self._resource_list("", "v1")
        if len(parts) == 3 and parts[0] == "apis":
            if parts[2] not in registry.groups().get(parts[1], []):
                raise NotFound("the server could not find the requested resource")
            return self._resource_list(parts[1], parts[2])
        return None

    def _aggregated(self, root: str) -> dict[str, Any]:
        """``/api`` or ``/apis`` as an ``apidiscovery.k8s.io/v2`` APIGroupDiscoveryList."""
        registry = self.store.registry
        groups = {"": ["v1"]} if root == "api" else registry.groups()
        items = []
        for group, versions in groups.items():
            meta: dict[str, Any] = {"creationTimestamp": None}
            if group:
                meta["name"] = group
            items.append({"metadata": meta, "versions": [
                {"version": v, "freshness": "Current",
                 "resources": [rt.aggregated_entry() for rt in registry.in_group_version(group, v)]}
                for v in versions]})
        return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                "metadata": {}, "items": items}

    @staticmethod
    def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = [e for rt in self.store.registry.in_group_version(group, version)
                     for e in rt.discovery_entries()]
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    def _parse_target(self, parts: list[str]) -> _Target:
        not_found = NotFound("the server could not find the requested resource")
        if len(parts) < 3 or parts[0] not in ("api", "apis"):
            raise not_found
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) < 4:
                raise not_found
            group, version, rest = parts[1], parts[2], parts[3:]
        legacy_watch = False
        if rest and rest[0] == "watch":
            legacy_watch, rest = True, rest[1:]
        registry = self.store.registry
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            inner = registry.lookup(group, version, rest[2])
            if inner is not None and inner.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise not_found
        rt = registry.lookup(group, version, rest[0])
        if rt is None:
            raise not_found
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if rt.namespaced and namespace is None and name is not None:
            raise not_found
        binding = sub == "binding" and rt.group == "" and rt.plural == "pods"
        if sub is not None and not ((sub == "status" and rt.has_status) or (sub == "scale" and rt.scalable)
                                    or binding):
            raise not_found
        return _Target(rt, namespace, name, sub, legacy_watch)

    @staticmethod
    def _verb(request: web.Request, target: _Target) -> str:
        method = request.method
        if target.name is None:
            if method == "GET":
                watch = target.legacy_watch or _bool_param(request.query.get("watch"))
                return "watch" if watch else "list"
            if method == "POST":
                return "create"
            if method == "DELETE" and target.subresource is None:
                return "deletecollection"
        elif target.subresource == "binding":
            if method == "POST":
                return "create"
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
            if verb is not None:
                return verb
        raise SimStatusError("the server does not allow this method on the requested resource",
                             code=405, reason="MethodNotAllowed")

    def _check_forbidden(self, target: _Target, verb: str) -> None:
        rt = target.resource
        if (rt.group, rt.plural) not in self.forbidden and (verb, rt.group, rt.plural) not in self.denied:
            return
        where = f' in the namespace "{target.namespace}"' if target.namespace else " at the cluster scope"
        raise SimStatusError(
            f'{rt.qualified} is forbidden: User "system:anonymous" cannot {verb} resource "{rt.plural}" '
            f'in API group "{rt.group}"{where}',
            code=403, reason="Forbidden", details={"group": rt.group, "kind": rt.plural},
        )

    async def _serve(self, request: web.Request, target: _Target, verb: str) -> web.StreamResponse:
        rt = target.resource
        store = self.store
        if rt.virtual:
            return await self._access_review(request, target, verb)
        if target.subresource == "scale":
            return await self._scale(request, target, verb)
        if target.subresource == "binding":
            return await self._bind(request, target)
        if verb == "list":
            return await self._list(request, target)
        if verb == "watch":
            return await self._watch(request, target)
        writer = _Writer.parse(request) if verb not in ("get",) else None
        if verb == "deletecollection":
            assert writer is not None
            return self._delete_collection(request, target, dry_run=writer.dry_run)
        if verb == "get":
            assert target.name is not None
            obj = store.get_raw(rt, target.name, target.namespace)
            if accepts_table(request.headers.get("Accept", "")):
                return _json_response(table(rt, [obj], include_object=request.query.get("includeObject",
                                                                                         "Metadata")))
            if accepts_partial(request.headers.get("Accept", ""), list_=False):
                return _json_response(partial(obj))
            return _json_response(obj)
        assert writer is not None
        if verb == "delete":
            body = await self._read_optional(request)
        else:
            body = await self._read_body(request, yaml_ok=request.content_type == PatchType.APPLY)
        if verb == "create":
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            if rt.namespaced and target.namespace is None:
                raise SimStatusError("the server does not allow this method on the requested resource",
                                     code=405, reason="MethodNotAllowed")
            self._require_namespace(rt, target.namespace)
            warnings = self._validate(rt, body, writer)
            created = store.create(rt, body, namespace=target.namespace, copy=False, dry_run=writer.dry_run,
                                   owner=writer.owner(rt, None))
            return _json_response(created, status=201, headers=warnings)
        assert target.name is not None
        if verb == "update":
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
            if meta is None or meta.get("name") != target.name:
                raise BadRequest("the name of the object does not match the name on the URL")
            warnings = self._validate(rt, body, writer)
            return _json_response(store.update(rt, body, namespace=target.namespace,
                                               subresource=target.subresource, copy=False,
                                               dry_run=writer.dry_run,
                                               owner=writer.owner(rt, target.subresource)), headers=warnings)
        if verb == "patch":
            content_type = request.content_type
            warnings = self._validate(rt, body, writer, patch=content_type != PatchType.JSON)
            if content_type == PatchType.APPLY:
                if not request.query.get("fieldManager"):
                    raise BadRequest('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required '
                                     "value: is required for apply patch")
                existed = self._exists(target)
                if not existed:
                    self._require_namespace(rt, target.namespace)
                return _json_response(self._apply(rt, target, body, writer), status=200 if existed else 201,
                                      headers=warnings)
            return _json_response(store.patch(rt, target.name, body, namespace=target.namespace,
                                              patch_type=content_type, subresource=target.subresource,
                                              copy=False, dry_run=writer.dry_run,
                                              owner=writer.owner(rt, target.subresource)), headers=warnings)
        # delete: DeleteOptions may carry preconditions
        pre = body.get("preconditions") if isinstance(body, dict) else None
        pre = pre if isinstance(pre, dict) else {}
        dry_run = writer.dry_run or (isinstance(body, dict) and body.get("dryRun") == ["All"])
        return _json_response(store.delete(rt, target.name, namespace=target.namespace,
                                           precondition_rv=pre.get("resourceVersion"),
                                           precondition_uid=pre.get("uid"), copy=False, dry_run=dry_run))

    async def _bind(self, request: web.Request, target: _Target) -> web.Response:
        """``POST pods/<name>/binding``, as the scheduler binds a Pod: sets ``spec.nodeName`` once
        (a Pod already bound answers 409, as kube-apiserver does); answers a ``Status`` 201."""
        assert target.name is not None
        body = await self._read_body(request)
        node = body.get("target", {}).get("name") if isinstance(body, dict) else None
        if not isinstance(node, str) or not node:
            raise Invalid(f'Binding.core "{target.name}" is invalid: target.name: Required value')
        pod = self.store.get_raw(target.resource, target.name, target.namespace)
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            raise Conflict(f'Operation cannot be fulfilled on pods/binding "{target.name}": pod '
                           f'{target.name} is already assigned to node "{bound}"',
                           details={"name": target.name, "kind": "pods/binding"})
        writer = _Writer.parse(request)
        self.store.patch(target.resource, target.name, {"spec": {"nodeName": node}},
                         namespace=target.namespace, dry_run=writer.dry_run,
                         owner=writer.owner(target.resource, "binding"))
        return _json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "code": 201}, status=201)

    def _exists(self, target: _Target) -> bool:
        assert target.name is not None
        try:
            self.store.get_raw(target.resource, target.name, target.namespace)
        except NotFound:
            return False
        return True

    def _apply(self, rt: ResourceType, target: _Target, body: Any, writer: _Writer) -> KubeObject:
        assert target.name is not None
        if not isinstance(body, dict):
            raise BadRequest("an apply patch must be an object")
        return self.store.apply(rt, target.name, body, namespace=target.namespace,
                                owner=writer.owner(rt, target.subresource), force=writer.force,
                                subresource=target.subresource, dry_run=writer.dry_run, copy=False)

    def _require_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        """A namespaced object can only be created in an existing Namespace (404 otherwise)."""
        if rt.namespaced and namespace and not self.store.has_namespace(namespace):
            raise NotFound.object(plural="namespaces", group="", name=namespace)

    def _validate(self, rt: ResourceType, body: Any, writer: _Writer, *,
                  patch: bool = True) -> dict[str, str]:
        """Unknown fields per ``fieldValidation``: Strict → 400, Warn → ``Warning`` headers."""
        if writer.validation == "Ignore" or not patch or not isinstance(body, dict):
            return {}
        schemas = self.store.schemas
        unknown = schemas.unknown_fields(schemas.kind(rt), _without_directives(body))
        if not unknown:
            return {}
        if writer.validation == "Strict":
            fields = ", ".join(f'unknown field "{p}"' for p in unknown)
            raise BadRequest(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                             f"strict decoding error: {fields}")
        return {"Warning": ", ".join(f'299 - "unknown field \\"{p}\\""' for p in unknown)}

    async def _access_review(self, request: web.Request, target: _Target, verb: str) -> web.Response:
        """SelfSubjectAccessReview: allowed unless the simulator forbids the resource."""
        if verb != "create":
            raise SimStatusError("the server does not allow this method on the requested resource",
                                 code=405, reason="MethodNotAllowed")
        body = await self._read_body(request)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        attrs = spec.get("resourceAttributes")
        allowed = True
        reason = "allowed by the simulator"
        if isinstance(attrs, dict):
            resource = str(attrs.get("resource") or "")
            group = str(attrs.get("group") or "")
            verb_asked = str(attrs.get("verb") or "")
            if (group, resource) in self.forbidden or ("*", resource) in self.forbidden:
                allowed, reason = False, "forbidden by the simulator's --forbid"
            elif (verb_asked, group, resource) in self.denied:
                allowed, reason = False, "denied by the simulator's --deny"
        review = {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                  "metadata": {"creationTimestamp": None}, "spec": spec,
                  "status": {"allowed": allowed, "reason": reason}}
        return _json_response(review, status=201)

    async def _scale(self, request: web.Request, target: _Target, verb: str) -> web.Response:
        """The ``scale`` subresource: an ``autoscaling/v1`` Scale view of ``spec.replicas``."""
        rt = target.resource
        store = self.store
        assert target.name is not None
        obj = store.get_raw(rt, target.name, target.namespace)
        if verb == "get":
            return _json_response(_scale_view(obj))
        if verb not in ("update", "patch"):
            raise SimStatusError("the server does not allow this method on the requested resource",
                                 code=405, reason="MethodNotAllowed")
        writer = _Writer.parse(request)
        body = await self._read_body(request)
        current = _scale_view(obj)
        if verb == "update":
            wanted = body
        elif request.content_type == PatchType.JSON:
            wanted = apply_json_patch(current, body)
        elif request.content_type == PatchType.STRATEGIC:
            wanted = strategic_merge_patch(current, body, store.schemas, store.schemas.scale())
        elif request.content_type == PatchType.MERGE:
            wanted = json_merge_patch(current, body)
        else:
            raise SimStatusError(f"the body of the request was in an unknown format - accepted media types "
                                 f"include: {PatchType.JSON}, {PatchType.MERGE}, {PatchType.STRATEGIC}",
                                 code=415, reason="UnsupportedMediaType")
        if not isinstance(wanted, dict):
            raise BadRequest("a Scale must be an object")
        replicas = (wanted.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise Invalid(f'Scale.autoscaling "{target.name}" is invalid: spec.replicas: Invalid value: '
                          f"{replicas!r}: must be greater than or equal to 0")
        patch: dict[str, Any] = {"spec": {"replicas": replicas}}
        wanted_rv = (wanted.get("metadata") or {}).get("resourceVersion") if verb == "update" else None
        if wanted_rv:
            patch["metadata"] = {"resourceVersion": str(wanted_rv)}
        updated = store.patch(rt, target.name, patch, namespace=target.namespace, patch_type=PatchType.MERGE,
                              copy=False, dry_run=writer.dry_run, owner=writer.owner(rt, "scale"))
        return _json_response(_scale_view(updated))

    @staticmethod
    async def _read_body(request: web.Request, *, yaml_ok: bool = False) -> Any:
        raw = await request.read()
        _check_bounds(raw)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if yaml_ok:  # an apply patch is YAML (kubectl sends JSON, which is YAML too)
                try:
                    return yaml.safe_load(raw)
                except yaml.YAMLError as yaml_exc:
                    raise BadRequest(f"the request body is not valid YAML: {yaml_exc}") from yaml_exc
            raise BadRequest(f"the request body is not valid JSON: {exc}") from exc

    @classmethod
    async def _read_optional(cls, request: web.Request) -> Any:
        if not request.can_read_body:
            return None
        raw = await request.read()
        if not raw.strip():
            return None
        _check_bounds(raw)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"the request body is not valid JSON: {exc}") from exc

    @staticmethod
    def _scope(request: web.Request, target: _Target) -> WatchFilter:
        try:
            scope = WatchFilter.parse(namespace=target.namespace,
                                      label_selector=request.query.get("labelSelector"),
                                      field_selector=request.query.get("fieldSelector"))
        except SelectorError as exc:
            raise BadRequest(f"unable to parse requirement: {exc}") from exc
        rt = target.resource
        for path, _, _ in scope.fields.requirements:
            if path in ("metadata.name", "metadata.namespace") or path in rt.field_selectors:
                continue
            if rt.crd:
                raise BadRequest(f'"{path}" is not a known field selector: only "metadata.name", '
                                 '"metadata.namespace"')
            raise BadRequest(f"field label not supported: {path}")
        return scope

    async def _wait_for(self, rv: int) -> None:
        if rv > self.store.resource_version and not await self.store.wait_for_rv(rv, self.too_large_wait):
            raise TooLargeResourceVersion.for_rv(rv, self.store.resource_version)

    def _delete_collection(self, request: web.Request, target: _Target, *,
                           dry_run: bool = False) -> web.Response:
        """Deletes every matching object (selectors and namespace apply) and lists what was deleted."""
        rt = target.resource
        store = self.store
        deleted = [store.delete(rt, key[1], namespace=key[0] or None, copy=False, dry_run=dry_run)
                   for key, _ in store.snapshot(rt, scope=self._scope(request, target))]
        return _json_response({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                               "metadata": {"resourceVersion": str(store.resource_version)},
                               "items": _list_items(rt, deleted)})

    # ------------------------------------------------------------------ list

    async def _list(self, request: web.Request, target: _Target) -> web.Response:
        rt = target.resource
        store = self.store
        query = request.query
        scope = self._scope(request, target)
        limit = _int_param("limit", query.get("limit"))
        if limit is not None and limit <= 0:
            limit = None
        token = query.get("continue") or ""
        rv_text = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch") or None
        if match not in (None, "NotOlderThan", "Exact"):
            raise Invalid(f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                          '"Exact", "NotOlderThan"')
        start: tuple[str, str] | None = None
        if token:
            if rv_text not in ("", "0"):
                raise BadRequest("specifying resource version is not allowed when using continue")
            token_rv, start = _decode_continue(token)
            if token_rv < 0:
                items = store.snapshot(rt, scope=scope)
                list_rv = store.resource_version
            else:
                try:
                    items = store.snapshot(rt, at_rv=token_rv, scope=scope)
                except Expired as exc:
                    raise Expired(_EXPIRED_CONTINUE_MESSAGE,
                                  continue_token=_encode_continue(-1, start)) from exc
                list_rv = token_rv
        else:
            if match is not None and rv_text == "":
                raise Invalid("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                              "resourceVersion is provided")
            rv = _int_param("resourceVersion", rv_text) or 0
            if match == "Exact" and rv == 0:
                raise Invalid('resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden '
                              'for resourceVersion "0"')
            await self._wait_for(rv)
            exact = match == "Exact" or (match is None and limit is not None and rv > 0)
            if exact and rv < store.resource_version:
                try:
                    items = store.snapshot(rt, at_rv=rv, scope=scope)
                except Expired as exc:
                    raise Expired("The resourceVersion for the provided list is too old.") from exc
                list_rv = rv
            else:
                items = store.snapshot(rt, scope=scope)
                list_rv = store.resource_version
            if rv_text == "0" and not self.cache_pagination:
                limit = None  # an older watch cache serves RV "0" whole, ignoring the limit
        # The snapshot is sorted by key: find where a continue token resumes by bisection, and
        # copy only the page (a 100k-object list in pages of 500 stays linear overall).
        offset = 0 if start is None else bisect.bisect_right(items, start, key=_item_key)
        metadata: dict[str, Any] = {"resourceVersion": str(list_rv)}
        total = len(items) - offset
        if limit is not None and total > limit:
            items = items[offset:offset + limit]
            metadata["continue"] = _encode_continue(list_rv, items[-1][0])
            if not scope.has_selectors:
                metadata["remainingItemCount"] = total - limit
        elif offset:
            items = items[offset:]
        if accepts_table(request.headers.get("Accept", "")):
            return _json_response(table(rt, [o for _, o in items], list_meta=metadata,
                                        include_object=query.get("includeObject", "Metadata")))
        if accepts_partial(request.headers.get("Accept", ""), list_=True):
            return _json_response(partial_list([o for _, o in items], metadata))
        body = {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": metadata,
                "items": _list_items(rt, [o for _, o in items])}
        return _json_response(body)

    # ------------------------------------------------------------------ watch

    def _bookmark(self, rt: ResourceType, rv: int, *, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
        return _event_line("BOOKMARK", orjson.dumps({"kind": rt.kind, "apiVersion": rt.api_version,
                                                     "metadata": meta}))

    async def _watch(self, request: web.Request, target: _Target) -> web.StreamResponse:
        rt = target.resource
        query = request.query
        scope = self._scope(request, target)
        bookmarks = _bool_param(query.get("allowWatchBookmarks"))
        match = query.get("resourceVersionMatch") or None
        send_initial_text = query.get("sendInitialEvents")
        send_initial = _bool_param(send_initial_text)
        if send_initial_text is not None:
            if not self.watch_list:
                raise Invalid('ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
                              "sendInitialEvents is forbidden for watch unless the WatchList feature gate "
                              "is enabled", details={"kind": "ListOptions", "group": "meta.k8s.io"})
            if match != "NotOlderThan":
                raise Invalid('ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                              "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                              details={"kind": "ListOptions", "group": "meta.k8s.io"})
            if send_initial and not bookmarks:
                raise Invalid('ListOptions.meta.k8s.io "" is invalid: allowWatchBookmarks: Forbidden: '
                              "allowWatchBookmarks must be true when sendInitialEvents is true",
                              details={"kind": "ListOptions", "group": "meta.k8s.io"})
        elif match is not None:
            raise Invalid('ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                          "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                          details={"kind": "ListOptions", "group": "meta.k8s.io"})
        rv_text = query.get("resourceVersion", "")
        rv = _int_param("resourceVersion", rv_text) or 0
        timeout_s = _int_param("timeoutSeconds", query.get("timeoutSeconds"))
        timeout = float(timeout_s) if timeout_s and timeout_s > 0 else self.default_watch_timeout
        await self._wait_for(rv)
        from_rv = None if (send_initial or rv == 0) else rv
        response = web.StreamResponse(status=200, headers={"Content-Type": _JSON,
                                                           "Cache-Control": "no-cache, private"})
        response.enable_chunked_encoding()
        try:
            watcher = self.store.watch(rt, from_rv=from_rv, scope=scope)
        except Expired as exc:
            await response.prepare(request)
            await response.write(_event_line("ERROR", orjson.dumps(exc.status())))
            await response.write_eof()
            return response
        try:
            await response.prepare(request)
            stream = _WatchStream(sim=self, request=request, response=response, watcher=watcher,
                                  bookmarks=bookmarks, timeout=timeout,
                                  as_table=accepts_table(request.headers.get("Accept", "")),
                                  as_partial=accepts_partial(request.headers.get("Accept", ""), list_=False))
            await stream.run(send_initial_end=send_initial)
        except (ConnectionResetError, asyncio.CancelledError):
            watcher.close("client went away")
            raise
        finally:
            watcher.close("watch ended")
        return response


class _WatchStream:
    """Writes one watch's events, bookmarks and injected faults to its HTTP response.

    Buffered changes are written in batches (one chunk per batch), so a watcher catching up on a long
    history is not paced by one write per event; fault thresholds still count single events.
    """

    def __init__(self, *, sim: Simulator, request: web.Request, response: web.StreamResponse,
                 watcher: Watcher, bookmarks: bool, timeout: float, as_table: bool = False,
                 as_partial: bool = False) -> None:
        self.sim = sim
        self.as_table = as_table
        self.as_partial = as_partial
        """Each event's object is a PartialObjectMetadata (a metadata-only watch)."""
        """Each event's object is a one-row Table (``kubectl get -w``)."""
        self.request = request
        self.response = response
        self.watcher = watcher
        self.bookmarks = bookmarks
        self.timeout = timeout
        self.sent = 0
        """Events written, bookmarks not counted (the fault thresholds count these)."""
        self.garbled = False

    async def _write(self, data: bytes) -> None:
        self.sim.bytes_sent += len(data)
        await self.response.write(data)

    async def _write_batch(self, changes: Sequence[Change]) -> bool:
        """Writes the events unless a fault ends the stream first; False means stop."""
        spec = self.sim.faults.spec
        out = bytearray()
        for change in changes:
            if spec.watch_expire_after is not None and self.sent >= spec.watch_expire_after:
                status = Expired("The resourceVersion for the provided watch is too old.").status()
                out += _event_line("ERROR", orjson.dumps(status))
                await self._write(bytes(out))
                return False
            if spec.watch_close_after is not None and self.sent >= spec.watch_close_after:
                if out:
                    await self._write(bytes(out))
                return False
            line = _event_line(change.type, self._encoded(change))
            if spec.watch_garble_after is not None and self.sent >= spec.watch_garble_after \
                    and not self.garbled:
                # The event's bytes with a stray byte in the middle: a complete line that no JSON
                # decoder accepts, as a corrupting proxy or a torn buffer would leave it.
                self.garbled = True
                half = len(line) // 2
                line = line[:half] + b"\x00<garbled>" + line[half:]
            if spec.watch_cut_after is not None and self.sent >= spec.watch_cut_after:
                out += line[: max(1, len(line) // 2)]
                await self._write(bytes(out))
                transport = self.request.transport
                if transport is not None:
                    transport.close()
                raise ConnectionResetError("line cut by fault injection")
            out += line
            self.sent += 1
        if out:
            await self._write(bytes(out))
        return True

    def _encoded(self, change: Change) -> bytes:
        if self.as_table:
            return orjson.dumps(table(self.watcher.resource, [change.obj],
                                      include_object=self.request.query.get("includeObject", "Metadata")))
        if self.as_partial:
            return orjson.dumps(partial(change.obj))
        return change.encoded_object()

    async def run(self, *, send_initial_end: bool) -> None:
        watcher = self.watcher
        rt = watcher.resource
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        initial = watcher.initial
        if not await self._held(deadline):
            return
        for start in range(0, len(initial), _BATCH):
            if watcher.closed or not await self._write_batch(initial[start:start + _BATCH]):
                return
        if send_initial_end:
            await self._write(self.sim._bookmark(rt, watcher.start_rv, initial_end=True))
        interval = self.sim.bookmark_interval
        next_bookmark = loop.time() + interval
        while True:
            if not await self._held(deadline):
                return
            batch = watcher.take(_BATCH)
            if batch:
                if not await self._write_batch(batch):
                    await self.response.write_eof()
                    return
            elif watcher.closed:
                if watcher.error is not None:
                    await self._write(_event_line("ERROR", orjson.dumps(watcher.error)))
                await self.response.write_eof()
                return
            else:
                wake_at = min(deadline, next_bookmark) if self.bookmarks else deadline
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, wake_at - loop.time())):
                        await watcher.wait()
            now = loop.time()
            if now >= deadline:
                if self.bookmarks and not watcher.closed and watcher.pending == 0:
                    await self._send_progress_bookmark()
                await self.response.write_eof()
                return
            # Due bookmarks go out even while events trickle in, once the buffer is drained.
            if self.bookmarks and now >= next_bookmark and watcher.pending == 0 and not watcher.closed:
                await self._send_progress_bookmark()
                next_bookmark = now + interval

    async def _held(self, deadline: float) -> bool:
        """Sends nothing while the ``watch_stall`` fault is set; False when the stream's timeout came
        meanwhile (the stream is then ended)."""
        loop = asyncio.get_running_loop()
        while self.sim.faults.spec.watch_stall and not self.watcher.closed:
            if loop.time() >= deadline:
                await self.response.write_eof()
                return False
            await asyncio.sleep(_STALL_POLL)
        return True

    async def _send_progress_bookmark(self) -> None:
        # With an empty buffer this watcher has been offered every change up to the store's RV.
        await self._write(self.sim._bookmark(self.watcher.resource, self.sim.store.resource_version))
