"""kube-event-bridge: client-go-style shared informers that forward Kubernetes object changes to sinks.

The public API is re-exported here. Submodules load on first use (PEP 562), so importing the package
(the CLI does) stays cheap; type checkers see the real imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "APIResource": "discovery",
    "AckFunc": "contracts",
    "AckTracker": "progress",
    "ApiClient": "apiclient",
    "ApiError": "errors",
    "ApiStatusError": "errors",
    "ApiUnavailableError": "errors",
    "Backoff": "backoff",
    "BadRequestError": "errors",
    "BridgeConfig": "config",
    "BridgeError": "errors",
    "BridgePipeline": "pipeline",
    "BridgeService": "service",
    "Checkpoint": "checkpoint",
    "CheckpointStore": "checkpoint",
    "Clock": "clock",
    "ConfigurationError": "errors",
    "ConflictError": "errors",
    "DeletedFinalStateUnknown": "contracts",
    "DeliveryObserver": "contracts",
    "Delta": "delta_fifo",
    "DeltaFIFO": "delta_fifo",
    "DeltaType": "delta_fifo",
    "Deltas": "delta_fifo",
    "Discovery": "discovery",
    "EventHandler": "contracts",
    "FIFOClosedError": "delta_fifo",
    "FakeClock": "clock",
    "FieldSelector": "labels",
    "FileCheckpointStore": "checkpoint",
    "ForbiddenError": "errors",
    "HandlerRegistration": "shared_informer",
    "HttpListerWatcher": "listwatch",
    "IndexFunc": "contracts",
    "IndexedCache": "store",
    "Indexer": "contracts",
    "InformerError": "shared_informer",
    "InformerKey": "factory",
    "KeyFunc": "contracts",
    "KubeObject": "contracts",
    "LabelSelector": "labels",
    "LeaderElector": "leaderelection",
    "ListOptions": "contracts",
    "ListPage": "contracts",
    "ListenerOptions": "contracts",
    "Lister": "listers",
    "ListerWatcher": "contracts",
    "NAMESPACE_INDEX": "store",
    "NotFoundError": "errors",
    "Notification": "contracts",
    "NotificationHandler": "contracts",
    "NotificationKind": "contracts",
    "ObjectKey": "contracts",
    "OverflowPolicy": "contracts",
    "ProcessorListener": "processor",
    "RawObject": "rawobject",
    "RawObjectError": "rawobject",
    "RealClock": "clock",
    "Reflector": "reflector",
    "ResourceExpiredError": "errors",
    "ResourceVersionMarker": "delta_fifo",
    "ServerError": "errors",
    "SharedIndexInformer": "shared_informer",
    "SharedInformerFactory": "factory",
    "SharedProcessor": "processor",
    "SinkListener": "pipeline",
    "Store": "contracts",
    "TooLargeResourceVersionError": "errors",
    "TooManyRequestsError": "errors",
    "TransformFunc": "contracts",
    "UnauthorizedError": "errors",
    "WatchEvent": "contracts",
    "WatchEventType": "contracts",
    "WatchOptions": "contracts",
    "WatchStream": "contracts",
    "WatchedResource": "pipeline",
    "drop_managed_fields": "transform",
    "informer_id": "checkpoint",
    "lister_watcher_for": "listwatch",
    "load_config": "config",
    "meta_namespace_index_func": "store",
    "meta_namespace_key_func": "store",
    "parse_field_selector": "labels",
    "parse_label_selector": "labels",
    "split_meta_namespace_key": "store",
    "status_error": "errors",
}

if TYPE_CHECKING:
    from bridge.apiclient import (
        ApiClient,
    )
    from bridge.backoff import (
        Backoff,
    )
    from bridge.checkpoint import (
        Checkpoint,
        CheckpointStore,
        FileCheckpointStore,
        informer_id,
    )
    from bridge.clock import (
        Clock,
        FakeClock,
        RealClock,
    )
    from bridge.config import (
        BridgeConfig,
        load_config,
    )
    from bridge.contracts import (
        AckFunc,
        DeletedFinalStateUnknown,
        DeliveryObserver,
        EventHandler,
        Indexer,
        IndexFunc,
        KeyFunc,
        KubeObject,
        ListenerOptions,
        ListerWatcher,
        ListOptions,
        ListPage,
        Notification,
        NotificationHandler,
        NotificationKind,
        ObjectKey,
        OverflowPolicy,
        Store,
        TransformFunc,
        WatchEvent,
        WatchEventType,
        WatchOptions,
        WatchStream,
    )
    from bridge.delta_fifo import (
        Delta,
        DeltaFIFO,
        Deltas,
        DeltaType,
        FIFOClosedError,
        ResourceVersionMarker,
    )
    from bridge.discovery import (
        APIResource,
        Discovery,
    )
    from bridge.errors import (
        ApiError,
        ApiStatusError,
        ApiUnavailableError,
        BadRequestError,
        BridgeError,
        ConfigurationError,
        ConflictError,
        ForbiddenError,
        NotFoundError,
        ResourceExpiredError,
        ServerError,
        TooLargeResourceVersionError,
        TooManyRequestsError,
        UnauthorizedError,
        status_error,
    )
    from bridge.factory import (
        InformerKey,
        SharedInformerFactory,
    )
    from bridge.labels import (
        FieldSelector,
        LabelSelector,
        parse_field_selector,
        parse_label_selector,
    )
    from bridge.leaderelection import (
        LeaderElector,
    )
    from bridge.listers import (
        Lister,
    )
    from bridge.listwatch import (
        HttpListerWatcher,
        lister_watcher_for,
    )
    from bridge.pipeline import (
        BridgePipeline,
        SinkListener,
        WatchedResource,
    )
    from bridge.processor import (
        ProcessorListener,
        SharedProcessor,
    )
    from bridge.progress import (
        AckTracker,
    )
    from bridge.rawobject import (
        RawObject,
        RawObjectError,
    )
    from bridge.reflector import (
        Reflector,
    )
    from bridge.service import (
        BridgeService,
    )
    from bridge.shared_informer import (
        HandlerRegistration,
        InformerError,
        SharedIndexInformer,
    )
    from bridge.store import (
        NAMESPACE_INDEX,
        IndexedCache,
        meta_namespace_index_func,
        meta_namespace_key_func,
        split_meta_namespace_key,
    )
    from bridge.transform import (
        drop_managed_fields,
    )

__all__ = [
    "NAMESPACE_INDEX",
    "APIResource",
    "AckFunc",
    "AckTracker",
    "ApiClient",
    "ApiError",
    "ApiStatusError",
    "ApiUnavailableError",
    "Backoff",
    "BadRequestError",
    "BridgeConfig",
    "BridgeError",
    "BridgePipeline",
    "BridgeService",
    "Checkpoint",
    "CheckpointStore",
    "Clock",
    "ConfigurationError",
    "ConflictError",
    "DeletedFinalStateUnknown",
    "DeliveryObserver",
    "Delta",
    "DeltaFIFO",
    "DeltaType",
    "Deltas",
    "Discovery",
    "EventHandler",
    "FIFOClosedError",
    "FakeClock",
    "FieldSelector",
    "FileCheckpointStore",
    "ForbiddenError",
    "HandlerRegistration",
    "HttpListerWatcher",
    "IndexFunc",
    "IndexedCache",
    "Indexer",
    "InformerError",
    "InformerKey",
    "KeyFunc",
    "KubeObject",
    "LabelSelector",
    "LeaderElector",
    "ListOptions",
    "ListPage",
    "ListenerOptions",
    "Lister",
    "ListerWatcher",
    "NotFoundError",
    "Notification",
    "NotificationHandler",
    "NotificationKind",
    "ObjectKey",
    "OverflowPolicy",
    "ProcessorListener",
    "RawObject",
    "RawObjectError",
    "RealClock",
    "Reflector",
    "ResourceExpiredError",
    "ResourceVersionMarker",
    "ServerError",
    "SharedIndexInformer",
    "SharedInformerFactory",
    "SharedProcessor",
    "SinkListener",
    "Store",
    "TooLargeResourceVersionError",
    "TooManyRequestsError",
    "TransformFunc",
    "UnauthorizedError",
    "WatchEvent",
    "WatchEventType",
    "WatchOptions",
    "WatchStream",
    "WatchedResource",
    "__version__",
    "drop_managed_fields",
    "informer_id",
    "lister_watcher_for",
    "load_config",
    "meta_namespace_index_func",
    "meta_namespace_key_func",
    "parse_field_selector",
    "parse_label_selector",
    "split_meta_namespace_key",
    "status_error",
]



def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bridge.{module}"), name)
    globals()[name] = value
    return value
