"""kube-event-bridge: client-go-style shared informers that forward Kubernetes object changes to sinks.

The public API is re-exported here. Submodules load on first use (PEP 562), so importing the package
(the CLI does) stays cheap; type checkers see the real imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bridge.version import __version__

_EXPORTS: dict[str, str] = {
    "APIResource": "kube.discovery",
    "AckFunc": "contracts",
    "AckTracker": "delivery.progress",
    "ApiClient": "kube.apiclient",
    "ApiError": "errors",
    "ApiStatusError": "errors",
    "ApiUnavailableError": "errors",
    "Backoff": "informer.backoff",
    "BadRequestError": "errors",
    "BridgeConfig": "service.config",
    "BridgeError": "errors",
    "BridgePipeline": "delivery.pipeline",
    "BridgeService": "service.service",
    "Checkpoint": "storage.checkpoint",
    "CheckpointStore": "storage.checkpoint",
    "Clock": "clock",
    "ConfigurationError": "errors",
    "ConflictError": "errors",
    "DeletedFinalStateUnknown": "contracts",
    "DeliveryObserver": "contracts",
    "Delta": "informer.delta_fifo",
    "DeltaType": "informer.delta_fifo",
    "Deltas": "informer.delta_fifo",
    "Discovery": "kube.discovery",
    "EventHandler": "contracts",
    "FIFOClosedError": "informer.delta_fifo",
    "FakeClock": "clock",
    "FieldSelector": "kube.labels",
    "FileCheckpointStore": "storage.checkpoint",
    "ForbiddenError": "errors",
    "HandlerRegistration": "informer.shared_informer",
    "HttpListerWatcher": "kube.listwatch",
    "IndexFunc": "contracts",
    "IndexedCache": "informer.store",
    "Indexer": "contracts",
    "InformerError": "informer.shared_informer",
    "InformerKey": "informer.factory",
    "KeyFunc": "contracts",
    "KubeObject": "contracts",
    "LabelSelector": "kube.labels",
    "LeaderElector": "kube.leaderelection",
    "ListOptions": "contracts",
    "ListPage": "contracts",
    "ListenerOptions": "contracts",
    "Lister": "informer.listers",
    "ListerWatcher": "contracts",
    "NAMESPACE_INDEX": "informer.store",
    "NotFoundError": "errors",
    "Notification": "contracts",
    "NotificationHandler": "contracts",
    "BatchInterrupted": "contracts",
    "BatchNotificationHandler": "contracts",
    "NotificationKind": "contracts",
    "ObjectKey": "contracts",
    "OverflowPolicy": "contracts",
    "ProcessorListener": "informer.processor",
    "RawObject": "rawobject",
    "RawObjectError": "rawobject",
    "RealClock": "clock",
    "RealFIFO": "informer.real_fifo",
    "Reflector": "informer.reflector",
    "ResourceExpiredError": "errors",
    "ResourceVersionMarker": "informer.delta_fifo",
    "ServerError": "errors",
    "SharedIndexInformer": "informer.shared_informer",
    "SharedInformerFactory": "informer.factory",
    "SharedProcessor": "informer.processor",
    "SinkListener": "delivery.pipeline",
    "Store": "contracts",
    "TooLargeResourceVersionError": "errors",
    "TooManyRequestsError": "errors",
    "TransformFunc": "contracts",
    "UnauthorizedError": "errors",
    "WatchEvent": "contracts",
    "WatchEventType": "contracts",
    "WatchOptions": "contracts",
    "WatchStream": "contracts",
    "WatchedResource": "delivery.pipeline",
    "drop_managed_fields": "informer.transform",
    "informer_id": "storage.checkpoint",
    "lister_watcher_for": "kube.listwatch",
    "load_config": "service.config",
    "meta_namespace_index_func": "informer.store",
    "meta_namespace_key_func": "informer.store",
    "parse_field_selector": "kube.labels",
    "parse_label_selector": "kube.labels",
    "split_meta_namespace_key": "informer.store",
    "status_error": "errors",
}

if TYPE_CHECKING:
    from bridge.clock import (
        Clock,
        FakeClock,
        RealClock,
    )
    from bridge.contracts import (
        AckFunc,
        BatchInterrupted,
        BatchNotificationHandler,
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
    from bridge.delivery.pipeline import (
        BridgePipeline,
        SinkListener,
        WatchedResource,
    )
    from bridge.delivery.progress import (
        AckTracker,
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
    from bridge.informer.backoff import (
        Backoff,
    )
    from bridge.informer.delta_fifo import (
        Delta,
        Deltas,
        DeltaType,
        FIFOClosedError,
        ResourceVersionMarker,
    )
    from bridge.informer.factory import (
        InformerKey,
        SharedInformerFactory,
    )
    from bridge.informer.listers import (
        Lister,
    )
    from bridge.informer.processor import (
        ProcessorListener,
        SharedProcessor,
    )
    from bridge.informer.real_fifo import (
        RealFIFO,
    )
    from bridge.informer.reflector import (
        Reflector,
    )
    from bridge.informer.shared_informer import (
        HandlerRegistration,
        InformerError,
        SharedIndexInformer,
    )
    from bridge.informer.store import (
        NAMESPACE_INDEX,
        IndexedCache,
        meta_namespace_index_func,
        meta_namespace_key_func,
        split_meta_namespace_key,
    )
    from bridge.informer.transform import (
        drop_managed_fields,
    )
    from bridge.kube.apiclient import (
        ApiClient,
    )
    from bridge.kube.discovery import (
        APIResource,
        Discovery,
    )
    from bridge.kube.labels import (
        FieldSelector,
        LabelSelector,
        parse_field_selector,
        parse_label_selector,
    )
    from bridge.kube.leaderelection import (
        LeaderElector,
    )
    from bridge.kube.listwatch import (
        HttpListerWatcher,
        lister_watcher_for,
    )
    from bridge.rawobject import (
        RawObject,
        RawObjectError,
    )
    from bridge.service.config import (
        BridgeConfig,
        load_config,
    )
    from bridge.service.service import (
        BridgeService,
    )
    from bridge.storage.checkpoint import (
        Checkpoint,
        CheckpointStore,
        FileCheckpointStore,
        informer_id,
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
    "BatchInterrupted",
    "BatchNotificationHandler",
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
    "RealFIFO",
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
