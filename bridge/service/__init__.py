"""The service process: CLI, configuration, health and readiness, telemetry, logging, the metered
sink wrapper and the demo. The only layer that imports every other one, concrete sinks included.
"""
