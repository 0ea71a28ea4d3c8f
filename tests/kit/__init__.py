"""Tests of the shipped test kit (bridge.testing)."""
