"""The informer machinery of client-go's ``tools/cache`` (1.36): Reflector → RealFIFO → Indexer →
SharedIndexInformer → processor, with listers, the factory, transforms and backoff.

Imports the foundations and ``bridge.kube``; never the delivery or service layers, never a sink.
"""
