"""Package marker for the informer-core tests."""
