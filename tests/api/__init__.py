"""Tests of the Kubernetes API access layer: client, auth and config, discovery, list and watch."""
