"""The bridge's own layer between informers and sinks: sink listeners and the pipeline, the
acknowledgement tracker, checkpoints and their stores, snapshots.

Imports the foundations, ``bridge.kube``, ``bridge.informer`` and the sink contract
(``sinks.contract``); never the service layer or a concrete sink.
"""
