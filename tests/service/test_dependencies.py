"""What the image and CI install: dependency floors past the known advisories, and one lock
(constraints.txt) of the exact set, used by the Dockerfile and by scripts/bootstrap.

The advisories below are those known when the floors were last raised (docs/operations.md,
"Upgrading the chart" says how to check the locked set against a vulnerability database)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints.txt"

ADVISORIES = {
    # distribution: (last affected version, what it was)
    "aiohttp": ("3.14.2", "request smuggling (3.10.11, 3.12.14), 3.13.x/3.14.x parser and cookie "
                          "advisories (fixed in 3.13.3, 3.13.4, 3.14.1, 3.14.3)"),
    "orjson": ("3.11.5", "unbounded recursion on deep documents (CVE-2024-27454 fixed in 3.9.15, "
                         "CVE-2025-67221 fixed in 3.11.6)"),
    "urllib3": ("2.6.3", "decompression bombs in the streaming API (CVE-2025-66471 fixed in 2.6.0, "
                         "CVE-2026-21441 in 2.6.3, CVE-2026-44432 in 2.7.0)"),
    "requests": ("2.32.3", ".netrc credentials leaked to other hosts (CVE-2024-47081, fixed in 2.32.4)"),
    "protobuf": ("5.29.4", "unbounded recursion (CVE-2025-4565, fixed in 5.29.5)"),
}


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs.extend(Requirement(r) for r in extra if not r.startswith("kube-event-bridge"))
    return reqs


@pytest.mark.parametrize("name", sorted(ADVISORIES))
def test_floors_exclude_versions_with_known_advisories(name: str) -> None:
    affected, what = ADVISORIES[name]
    found = [r for r in _requirements() if canonicalize_name(r.name) == name]
    assert found, f"{name} needs a floor of its own in pyproject.toml ({what})"
    for req in found:
        assert not req.specifier.contains(affected, prereleases=True), \
            f"{req} still allows {affected}: {what}"


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in LOCK.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {line!r} is not an exact pin"
        assert version, f"constraints.txt: {line!r} is not an exact pin"
        pins[canonicalize_name(name)] = version
    return pins


def test_the_lock_pins_every_dependency_exactly_and_agrees_with_the_floors() -> None:
    pins = _locked()
    for req in _requirements():
        if req.marker is not None and not req.marker.evaluate({"extra": "x"}):
            continue
        name = canonicalize_name(req.name)
        if name not in pins:
            assert name in ("protobuf", "opentelemetry-exporter-otlp-proto-http", "atheris"), \
                f"{name} is not in constraints.txt: run scripts/lock"
            continue
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (req, pins[name])


def test_this_environment_was_installed_from_the_lock() -> None:
    pins = _locked()
    differing = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins and dist.version != pins[name]:
            differing[name] = (dist.version, pins[name])
    assert differing == {}, "installed != constraints.txt: run scripts/bootstrap (or scripts/lock)"
    # The runtime closure of the project is locked whole.
    missing = []
    todo = ["kube-event-bridge"]
    seen: set[str] = set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.requires(name) or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in pins:
                missing.append(dep)
            todo.append(dep)
    assert missing == [], f"not in constraints.txt: {sorted(set(missing))}"


def test_the_image_and_bootstrap_install_the_locked_set() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml README.md constraints.txt ./" in dockerfile
    assert "pip install --no-cache-dir --constraint constraints.txt ." in dockerfile
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    assert '--constraint "$root/constraints.txt"' in bootstrap
