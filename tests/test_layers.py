"""The import direction between the layers (docs/architecture.md), checked on every module's source.

foundations ← kube ← informer, storage ← delivery ← service; ``sinks`` depends only on the sink
contract, its own helpers and the foundations; the simulator and the test helpers sit beside the layers they
exercise. Every import counts: module level, inside functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FOUNDATIONS = ("bridge.contracts", "bridge.rawobject", "bridge.errors", "bridge.clock", "bridge.version",
               "bridge.labels", "bridge.resource_version", "bridge.jsonbounds", "bridge.bounded_read",
               "bridge.rawobject_type", "bridge.rawobject_decode", "bridge.managed_fields",
               "bridge.watchline")
"""Imported by every layer, importing none: only each other (a foundation cut into parts, as
``bridge.rawobject`` over ``bridge.rawobject_type``), never in a cycle (below)."""

# layer → the prefixes of project modules it may import (besides itself)
ALLOWED: dict[str, tuple[str, ...]] = {
    "foundations": (),
    "bridge.kube": FOUNDATIONS,
    "bridge.informer": (*FOUNDATIONS, "bridge.kube"),
    "bridge.storage": (*FOUNDATIONS, "bridge.kube"),
    "bridge.delivery": (*FOUNDATIONS, "bridge.kube", "bridge.informer", "bridge.storage", "sinks.contract"),
    "bridge.service": ("bridge", "sinks"),
    "bridge.sim": (*FOUNDATIONS, "bridge.kube"),
    "bridge.testing": (*FOUNDATIONS, "bridge.kube", "bridge.informer", "bridge.storage", "sinks.contract"),
    "sinks": FOUNDATIONS,
}


def layer_of(module: str) -> str:
    if module in FOUNDATIONS:
        return "foundations"
    for layer in ALLOWED:
        if layer != "foundations" and (module == layer or module.startswith(layer + ".")):
            return layer
    raise AssertionError(f"{module} belongs to no layer: add it to a layer package or to FOUNDATIONS")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports(source: str, module: str, *, is_package: bool) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a ``bridge`` or ``sinks`` module in ``source``."""
    found: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target in ("bridge", "sinks"):
                # ``from bridge import x`` names a submodule or a re-export: resolve to the submodule
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name.split(".")[0] in ("bridge", "sinks")]


def violations(source: str, module: str, *, is_package: bool = False) -> list[str]:
    if module in ("bridge", "sinks"):
        return []  # the package roots re-export the public API of every layer
    layer = layer_of(module)
    allowed = ALLOWED[layer]
    own = FOUNDATIONS if layer == "foundations" else (layer,)
    bad = []
    for line, target in project_imports(source, module, is_package=is_package):
        if layer == "foundations":
            ok = target in FOUNDATIONS
        else:
            ok = any(target == p or target.startswith(p + ".") for p in (*own, *allowed))
        if not ok:
            may = allowed or ("only other foundations" if layer == "foundations" else "nothing")
            bad.append(f"{module}:{line} imports {target} (layer {layer} may import {may})")
    return bad


def all_modules() -> list[Path]:
    return sorted([*ROOT.joinpath("bridge").rglob("*.py"), *ROOT.joinpath("sinks").rglob("*.py")])


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_follow_the_layers(path: Path) -> None:
    module = module_name(path)
    assert violations(path.read_text(), module, is_package=path.name == "__init__.py") == []


def test_every_layer_package_exists() -> None:
    for layer in ("kube", "informer", "storage", "delivery", "service"):
        assert ROOT.joinpath("bridge", layer, "__init__.py").is_file()


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("bridge.rawobject", "from bridge.kube.labels import parse_label_selector\n"),
        ("bridge.kube.listwatch", "from bridge.informer.store import IndexedCache\n"),
        ("bridge.informer.reflector", "def f():\n    from bridge.delivery.progress import AckTracker\n"),
        ("bridge.informer.store", "if TYPE_CHECKING:\n    import sinks.kafka\n"),
        ("bridge.delivery.pipeline", "from bridge.service.telemetry import Telemetry\n"),
        ("bridge.delivery.pipeline", "from sinks.kafka import KafkaSink\n"),
        ("sinks.kafka", "from bridge.informer.reflector import Reflector\n"),
        ("sinks.base", "from bridge import delivery\n"),
        ("bridge.storage.checkpoint", "from bridge.delivery.progress import AckTracker\n"),
        ("bridge.storage.blobstore", "from bridge.informer.store import IndexedCache\n"),
        ("bridge.kube.discovery", "from ..informer import store\n"),
        ("bridge.managed_fields", "from bridge.kube import bounded\n"),
        ("bridge.rawobject_type", "from bridge import delivery\n"),
    ],
)
def test_a_forbidden_import_is_reported(module: str, source: str) -> None:
    assert violations(source, module) != []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("bridge.informer.reflector", "from bridge.kube.apiclient import ApiClient\nimport bridge.clock\n"),
        ("bridge.delivery.pipeline", "from sinks.contract import ChangeEvent\n"),
        ("sinks.kafka", "from bridge.rawobject import RawObject\nfrom sinks.base import BaseSink\n"),
        ("sinks.filters", "from bridge.labels import parse_label_selector\n"),
        ("bridge.service.cli", "from sinks.registry import create_sink\n"),
        ("bridge.kube.discovery", "from .apiclient import ApiClient\n"),
        ("bridge.rawobject", "from bridge.rawobject_type import RawObject\n"),
        ("bridge.rawobject_decode", "from bridge import managed_fields\n"),
    ],
)
def test_an_allowed_import_passes(module: str, source: str) -> None:
    assert violations(source, module) == []


# --------------------------------------------------------------------------------------------------
# No import cycles


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module → the project modules it imports (every import: module level, inside functions,
    under ``TYPE_CHECKING``), for ``sources`` (module → (source, is_package)). ``from pkg import
    name`` counts as an import of ``pkg.name`` when that is a module."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        edges: set[str] = set()
        tree = ast.parse(source)
        names_of = {node.lineno: [a.name for a in node.names] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom)}
        for line, target in project_imports(source, module, is_package=is_package):
            subs = [f"{target}.{n}" for n in names_of.get(line, []) if f"{target}.{n}" in sources]
            edges.update(subs or [target])
        graph[module] = {t for t in edges if t in sources and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each a cycle or several), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def project_sources() -> dict[str, tuple[str, bool]]:
    roots = ("bridge", "sinks")  # the package roots re-export every layer by name, lazily
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in all_modules()
            if module_name(p) not in roots}


def test_no_module_takes_part_in_an_import_cycle() -> None:
    """A cycle, even through an import inside a function (the usual way to dodge one at run time),
    means two modules that cannot be understood, tested or changed apart: move what both need down."""
    assert cycles(import_graph(project_sources())) == []


def test_a_cycle_through_a_function_level_import_is_reported() -> None:
    sources = {
        "bridge.delivery.a": ("from bridge.delivery.b import B\n", False),
        "bridge.delivery.b": ("def f():\n    from bridge.delivery.a import A\n", False),
        "bridge.delivery.c": ("from bridge.delivery import a\n", False),
        "bridge.delivery.d": ("if TYPE_CHECKING:\n    from bridge.delivery.c import C\n", False),
    }
    assert cycles(import_graph(sources)) == [["bridge.delivery.a", "bridge.delivery.b"]]
    sources["bridge.delivery.a"] = ("from bridge.delivery.d import D\n", False)
    sources["bridge.delivery.b"] = ("", False)
    assert cycles(import_graph(sources)) == [["bridge.delivery.a", "bridge.delivery.c", "bridge.delivery.d"]]


# Every ``getattr(obj, name)`` in bridge/ and sinks/, by (module, obj, name), with why it is not a
# probe of a sink or a store for something no Protocol declares. A new one fails the test below:
# declare what is needed on the Protocol (sinks.contract, the store Protocols) instead.
GETATTR_ALLOWED: dict[tuple[str, str, str], str] = {
    ("bridge", 'importlib.import_module(f"bridge.{module}")', "name"): "lazy re-export of the API",
    ("sinks", "importlib.import_module(module)", "name"): "lazy re-export of the API",
    ("bridge.informer.handler_call", "type(handler)", '"handle_batch"'):
        "an informer event handler (client-go's ResourceEventHandler), not a sink or a store",
    ("bridge.kube.apiclient", "e", "'strerror'"): "an exception's optional detail",
    ("bridge.kube.discovery", "self._client", '"get_negotiated"'):
        "the Kubernetes client library's optional method",
    ("bridge.kube.kubeconfig", "self._configuration", '"refresh_api_key_hook"'):
        "the Kubernetes client library's configuration",
    ("bridge.kube.kubeconfig", "configuration", '"refresh_api_key_hook"'):
        "the Kubernetes client library's configuration",
    ("bridge.kube.kubeconfig", "configuration", '"tls_server_name"'):
        "the Kubernetes client library's configuration (older versions lack it)",
    ("bridge.kube.kubeconfig", "e", '"problem_mark"'): "a YAML error's optional detail",
    ("bridge.kube.kubeconfig", "e", '"problem"'): "a YAML error's optional detail",
    ("bridge.service.config_schema", "factory", '"__self__"'): "the class a bound factory belongs to",
    ("bridge.informer.namespaces", "self._inner", '"batches"'):
        "a lister-watcher's watch stream's optional batch read (not a sink or a store)",
    ("bridge.informer.namespaces", "source", '"aclose"'): "an async iterator's optional aclose",
    ("bridge.kube.apiclient", "self", "attr"): "the client's own two session attributes, by name",
    ("bridge.service.health", "site", '"_server"'): "aiohttp's listening socket, for the bound port",
    ("bridge.service.health", "server", '"sockets"'): "aiohttp's listening socket, for the bound port",
    ("bridge.service.verify_cli", "args", '"kafka_config"'): "an argparse namespace",
    ("bridge.service.verify_cli", "args", '"nats_connect"'): "an argparse namespace",
    ("sinks.cel", "value", "name"): "a CEL field selection on event data",
    ("sinks.templates", "event.resource", "field"): "a template field of the event's resource",
    ("sinks.registry", "target", '"from_options"'):
        "an entry point's target: a Sink class's from_options or a factory (docs/sinks.md)",
}


def getattr_calls(source: str) -> list[tuple[int, str, str]]:
    """(line, object, attribute) of every ``getattr(...)`` call, as written."""
    return [(node.lineno, ast.get_source_segment(source, node.args[0]) or "",
             ast.get_source_segment(source, node.args[1]) or "")
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2]


def test_no_getattr_probes_a_sink_or_a_store() -> None:
    """What the bridge reads of a sink or a store is declared on a Protocol (a third-party sink
    written against the Protocol gets the same treatment); ``getattr`` is left for the uses above."""
    found = []
    for path in all_modules():
        module = module_name(path)
        for line, obj, attr in getattr_calls(path.read_text()):
            if (module, obj, attr) not in GETATTR_ALLOWED:
                found.append(f"{module}:{line} getattr({obj}, {attr})")
    assert found == []


# The only modules that define a ``__getattr__``: the package roots' lazy re-exports of the API
# (PEP 562, at module level). Nothing else forwards attribute lookups to another object: a sink's
# delivery chain declares its stages (bridge.delivery.chain), and a wrapper states what it adds.
MODULE_GETATTR_ALLOWED = frozenset({"bridge", "sinks"})


def getattr_hooks(source: str) -> list[tuple[int, str]]:
    """(line, where) of every ``__getattr__`` / ``__getattribute__`` defined in ``source``: ``where``
    is the class that defines it, or ``<module>`` for a module-level one."""
    hooks: list[tuple[int, str]] = []

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if child.name in ("__getattr__", "__getattribute__"):
                    hooks.append((child.lineno, owner))
                visit(child, "<function>" if owner == "<module>" else owner)
            else:
                visit(child, owner)

    visit(ast.parse(source), "<module>")
    return hooks


def test_no_class_forwards_attributes_through_getattr() -> None:
    """No object in bridge/ or sinks/ answers for attributes it does not define (a wrapper
    imitating a sink hid the sink's status that way: its filter errors went unexported under
    ``profile: events``); the package roots' module-level lazy exports are the only ``__getattr__``."""
    found = []
    for path in all_modules():
        module = module_name(path)
        for line, owner in getattr_hooks(path.read_text()):
            if owner != "<module>" or module not in MODULE_GETATTR_ALLOWED:
                found.append(f"{module}:{line} {owner}.__getattr__")
    assert found == []


def test_a_class_level_getattr_is_reported() -> None:
    source = ("def __getattr__(name):\n    return name\n"
              "class Wrapper:\n    def __getattr__(self, item):\n        return getattr(self.inner, item)\n"
              "    class Nested:\n        def __getattribute__(self, item):\n            return 1\n")
    assert getattr_hooks(source) == [(1, "<module>"), (4, "Wrapper"), (7, "Nested")]


def test_a_new_getattr_on_a_sink_is_reported() -> None:
    source = 'def f(sink):\n    return getattr(type(sink), "deliver_batch", None)\n'
    assert getattr_calls(source) == [(2, "type(sink)", '"deliver_batch"')]
    assert ("bridge.delivery.sink_listener", "type(sink)", '"deliver_batch"') not in GETATTR_ALLOWED


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

# The modules and functions of bridge/ and sinks/ allowed over the limits: none (the last ones, the
# informer core, the raw-object decoder, the list-watch, the service's run loop and the base sink,
# were split by concept). A new offender fails the test below.
SIZE_ALLOWED: dict[str, str] = {}


def oversized(source: str, where: str) -> dict[str, int]:
    """``where`` (the module) and ``where::Class.function`` (every function, nested ones and methods
    included) → its length in lines, for those over the limits."""
    found: dict[str, int] = {}
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES:
        found[where] = lines

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found[f"{where}::{prefix}{child.name}"] = length
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_modules_and_functions_stay_small() -> None:
    """bridge/ and sinks/ (the simulator aside) are read by people changing them: no module over 600
    lines, no function over 60 (split by concept instead), but for :data:`SIZE_ALLOWED`."""
    found: dict[str, int] = {}
    for path in all_modules():
        where = path.relative_to(ROOT).as_posix()
        if not where.startswith("bridge/sim/"):
            found.update(oversized(path.read_text(), where))
    assert [f"{name}: {n} lines" for name, n in found.items() if name not in SIZE_ALLOWED] == []
    assert [f"{name} is within the limits now: remove it from SIZE_ALLOWED"
            for name in SIZE_ALLOWED if name not in found] == []


def test_an_oversized_module_or_function_is_reported() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(60))  # 60 statements, in a function's body
    source = "class C:\n    def m(self):\n" + body + "    def short(self):\n        pass\n"
    source += "def f():\n    def inner():\n" + body + "    return inner\n"
    assert oversized(source, "m.py") == {"m.py::C.m": 61, "m.py::f": 63, "m.py::f.inner": 61}
    assert oversized("x = 1\n" * 601, "m.py") == {"m.py": 601}
    assert oversized("x = 1\n" * 600, "m.py") == {}
