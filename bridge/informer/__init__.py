"""The informer machinery of client-go's ``tools/cache``: Reflector → DeltaFIFO → Indexer →
SharedIndexInformer → processor, with listers, the factory, transforms and backoff.

Imports the foundations and ``bridge.kube``; never the delivery or service layers, never a sink.
"""
