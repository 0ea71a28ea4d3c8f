"""The package re-exports its public API lazily: every name resolves, and importing the package
does not import the heavy modules."""

from __future__ import annotations

import subprocess
import sys

import bridge


def test_every_exported_name_resolves() -> None:
    for name in bridge.__all__:
        assert getattr(bridge, name) is not None, name


def test_importing_the_package_is_cheap() -> None:
    code = ("import sys, bridge; print(sorted(m for m in sys.modules"
            " if m.startswith(('bridge.', 'kubernetes', 'aiohttp'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['bridge.version']"  # a module holding one string, nothing else


def test_sinks_package_exports_the_plugin_api() -> None:
    import sinks

    for name in sinks.__all__:
        assert getattr(sinks, name) is not None, name
    sink = sinks.create_sink("stdout", "out", {})
    assert isinstance(sink, sinks.BaseSink)
    assert isinstance(sink, sinks.Sink)
