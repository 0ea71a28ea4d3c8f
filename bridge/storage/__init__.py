"""The storage layer: fencing, the fenced blob-store interface, the one chunked writer, and the
checkpoint stores built on them (files, ConfigMaps, NATS KV). It knows nothing of delivery: the
delivery layer above it decides what a checkpoint holds and when it is written."""
