"""CEL filters and field projection for sinks (docs/filters.md).

A sink's ``filter`` is one expression in CEL, the language of Kubernetes' admission policies and CRD
validation rules, evaluated with Google's CEL runtime (``cel-expr-python``, the C++ implementation
with its type checker). Its variables follow Kubernetes' conventions: ``object`` (the object as the
sink sends it, after redaction), ``oldObject`` (the previous state; null for added events and
whenever it is unknown), ``type`` (``"added"``, ``"updated"``, ``"deleted"``, ``"sync"`` and the
marker types), ``resource`` (``pods``, ``deployments.apps``), ``namespace`` and ``manager`` (the
field manager of the change, ``""`` when unknown).

Why the expression is read before it is run. Converting a whole 4 KB Pod into CEL values costs far
more than evaluating a comparison on it, so the expression's tokens are read once, when the
configuration loads, for the paths it selects from ``object`` and ``oldObject`` (``object.status.phase``,
``object.metadata.labels["team"]``): each event hands the evaluator a copy of the object pruned to
those subtrees, which evaluates exactly as the whole object would (a key present in the object is
present in the copy, with the same value; a missing one is missing in both). Below a comprehension
(``containers.exists(c, c.image …)``) the paths its variable selects count for every item
(``containers.*.image``); ``oldObject == null`` reads only whether there is one. A selection that is
not a plain chain of field names and string-literal indexes (``object[k]``, ``(object).a``,
``object`` passed whole) makes the evaluator get the whole object. An object kept as bytes
(:class:`~bridge.rawobject.RawObject`) is decoded in one msgspec pass that builds only those
subtrees (:class:`_Plan`). The same reading tells which variables the
expression names: a snapshot or gap marker (no object) passes every filter that does not name
``type``, and is evaluated by one that does.

``type`` is a name CEL's standard environment already declares (the type of types) and
``namespace`` a word CEL reserves, so both are declared under internal names of the same length and
the expression's ``type`` and ``namespace`` identifiers (not ``type(x)``, the function, nor a field
``x.type``) are renamed before compiling: CEL's positions in its messages still point into the
expression as written.

Evaluation is shared: sinks with the same expression and the same redaction share one
:class:`CelFilter` (see :func:`shared_filter`), which remembers its verdict for the last event, so a
change delivered to several such sinks is evaluated once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import orjson
from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_optional, ext_strings

from bridge.rawobject import RawObject, last_change, plain
from sinks.contract import ChangeEvent
from sinks.filters import WILDCARD, Path, is_mapping
from sinks.redaction import Redactor

__all__ = [
    "ERROR",
    "FAIL",
    "PASS",
    "VARIABLES",
    "CelError",
    "CelFilter",
    "CompiledExpression",
    "Projection",
    "compile_expression",
    "prune",
    "shared_filter",
]

log = logging.getLogger(__name__)

VARIABLES: Final = ("object", "oldObject", "type", "resource", "namespace", "manager")
_INTERNAL: Final = {"type": "_typ", "namespace": "_nmspace_"}
"""Variables CEL will not declare under their names (``type`` is the type of types, ``namespace`` a
reserved word), and the internal names of the same length they are declared under: positions in
CEL's messages stay right."""

PASS: Final = 1
FAIL: Final = 0
ERROR: Final = -1


class CelError(ValueError):
    """An expression CEL rejects (syntax, unknown function, wrong type): CEL's message and position."""


# ---- reading the expression ----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?
        (?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?
        |\d+(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<punct>\.\?|\[\?|==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
  | (?P<other>.)
    """,
    re.VERBOSE,
)

_SIMPLE_STRING = re.compile(r"""^(?:"([^"\\\n]*)"|'([^'\\\n]*)')$""")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    start: int


def _tokens(source: str) -> list[_Token]:
    return [_Token(m.lastgroup or "other", m.group(), m.start()) for m in _TOKEN.finditer(source)
            if m.lastgroup != "space"]


def _literal(text: str) -> str | None:
    """The value of a string literal without prefixes or escapes (what a path index needs)."""
    match = _SIMPLE_STRING.match(text)
    if match is None:
        return None
    return match.group(1) if match.group(1) is not None else match.group(2)


@dataclass(frozen=True, slots=True)
class Reads:
    """What an expression reads: the variables it names and, for ``object`` and ``oldObject``, the
    paths it selects (None: the whole object)."""

    variables: frozenset[str]
    object_paths: tuple[Path, ...] | None
    old_paths: tuple[Path, ...] | None


_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


def _closing(tokens: list[_Token], j: int) -> int:
    """The index of the ``)`` matching the ``(`` at ``tokens[j]`` (len(tokens) when unbalanced)."""
    depth = 0
    for k in range(j, len(tokens)):
        text = tokens[k].text
        if text in ("(", "[", "[?", "{"):
            depth += 1
        elif text in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return k
    return len(tokens)


def _selection(tokens: list[_Token], i: int) -> list[Path] | None:
    """The paths read through the variable at ``tokens[i]``: its chain of field selections, and when
    the chain ends in a comprehension (``.exists(c, c.image == …)``, ``.map(c, c.image)``), the paths
    its variable selects below every item (``spec.containers.*.image``). None when the variable is
    used otherwise than through such a chain (then the whole object is needed)."""
    path: list[str] = []
    j = i + 1
    n = len(tokens)
    while j < n:
        tok = tokens[j]
        if tok.text in (".", ".?") and j + 1 < n and tokens[j + 1].kind == "ident":
            if j + 2 < n and tokens[j + 2].text == "(":
                if path and tok.text == "." and tokens[j + 1].text in _MACROS:
                    return _comprehension(tokens, j + 2, tuple(path))
                break  # a method call on what was selected so far
            path.append(tokens[j + 1].text)
            j += 2
        elif tok.text in ("[", "[?") and j + 2 < n and tokens[j + 1].kind == "string" \
                and tokens[j + 2].text == "]":
            value = _literal(tokens[j + 1].text)
            if value is None:
                break
            path.append(value)
            j += 3
        else:
            break
    return [tuple(path)] if path else None


def _comprehension(tokens: list[_Token], open_at: int, base: Path) -> list[Path]:
    """The paths a one-variable comprehension over ``base`` reads (``base`` whole when its variable
    is used otherwise than through field selections)."""
    n = len(tokens)
    if not (open_at + 2 < n and tokens[open_at + 1].kind == "ident" and tokens[open_at + 2].text == ","):
        return [base]
    if open_at + 4 < n and tokens[open_at + 3].kind == "ident" and tokens[open_at + 4].text == ",":
        return [base]  # the two-variable form
    var = tokens[open_at + 1].text
    paths: list[Path] = []
    for m in range(open_at + 3, _closing(tokens, open_at)):
        tok = tokens[m]
        if tok.kind != "ident" or tok.text != var or tokens[m - 1].text in (".", ".?"):
            continue
        below = _selection(tokens, m)
        if below is None:
            return [base]
        paths += [(*base, WILDCARD, *p) for p in below]
    return paths or [base]


_BOUNDARY = frozenset({"(", ")", "&&", "||", "?", ":", ",", "[", "]", "{", "}"})
"""Tokens binding looser than ``==``: what may stand on the far side of ``x == null`` for the
comparison to be with ``x`` itself."""


def _null_test(tokens: list[_Token], i: int) -> bool:
    """``x == null``, ``x != null`` (or ``null == x``) standing alone: reads whether the object
    exists, nothing of it (the evaluator is handed an empty mapping for it unless other selections
    read more)."""
    n = len(tokens)

    def loose(j: int) -> bool:
        return j < 0 or j >= n or tokens[j].text in _BOUNDARY

    if i + 2 < n and tokens[i + 1].text in ("==", "!=") and tokens[i + 2].text == "null":
        return loose(i - 1) and loose(i + 3)
    if i >= 2 and tokens[i - 1].text in ("==", "!=") and tokens[i - 2].text == "null":
        return loose(i - 3) and loose(i + 1)
    return False


def _minimal(paths: Iterable[Path]) -> tuple[Path, ...]:
    """The paths without those under another one."""
    out: list[Path] = []
    for path in sorted(set(paths), key=lambda p: (len(p), p)):
        if not any(path[: len(p)] == p for p in out):
            out.append(path)
    return tuple(out)


def read_expression(source: str) -> tuple[Reads, str]:
    """The expression's reads, and its source with the ``type`` variable renamed for CEL."""
    tokens = _tokens(source)
    names: set[str] = set()
    paths: dict[str, list[Path] | None] = {"object": [], "oldObject": []}
    renamed = source
    for i, tok in enumerate(tokens):
        if tok.kind != "ident" or tok.text not in VARIABLES:
            continue
        if i and tokens[i - 1].text in (".", ".?"):
            continue  # a field of that name, not the variable
        if i + 1 < len(tokens) and tokens[i + 1].text == "(":
            continue  # a function call: type(x)
        names.add(tok.text)
        internal = _INTERNAL.get(tok.text)
        if internal is not None:
            renamed = renamed[: tok.start] + internal + renamed[tok.start + len(internal):]
        elif tok.text in paths:
            found = paths[tok.text]
            if found is not None and not _null_test(tokens, i):
                selected = _selection(tokens, i)
                if selected is None:
                    paths[tok.text] = None
                else:
                    found += selected
    obj, old = paths["object"], paths["oldObject"]
    return Reads(
        variables=frozenset(names),
        object_paths=None if obj is None else _minimal(obj),
        old_paths=None if old is None else _minimal(old),
    ), renamed


# ---- pruning (the filter's reads and the sink's ``fields``) ---------------------------------------

_Trie = dict[str, Any]
_WHOLE: _Trie = {}


def _trie(paths: Iterable[Path]) -> _Trie:
    root: _Trie = {}
    for path in _minimal(paths):
        node = root
        for seg in path[:-1]:
            nxt = node.get(seg)
            if nxt is None:
                nxt = node[seg] = {}
            node = nxt
        node[path[-1]] = _WHOLE
    return root


def _whole(value: Any) -> Any:
    return plain(value) if type(value) is RawObject else value


def _merged(a: _Trie, b: _Trie) -> _Trie:
    """The union of two subtries (a key named and ``*`` both selecting below one key)."""
    if a is _WHOLE or b is _WHOLE:
        return _WHOLE
    out = dict(a)
    for key, sub in b.items():
        out[key] = _merged(out[key], sub) if key in out else sub
    return out


def _prune(node: Any, trie: _Trie) -> Any:
    """``node`` with only the subtrees ``trie`` names (``*``: every key or item). A value where the
    path expects a mapping (or, for ``*``, a list) is kept whole, so that reading it fails or
    succeeds as on the original."""
    if is_mapping(node):
        out: dict[str, Any] = {}
        wild = trie.get(WILDCARD)
        keys: Iterable[str] = node.keys() if wild is not None else [k for k in trie if k in node]
        for key in keys:
            sub = trie.get(key)
            if sub is None:
                sub = wild
                if sub is None:
                    continue
            elif wild is not None:
                sub = _merged(sub, wild)
            value = node[key]
            out[key] = _whole(value) if sub is _WHOLE else _prune(value, sub)
        return out
    wild = trie.get(WILDCARD)
    if wild is not None and isinstance(node, list):
        return [item if wild is _WHOLE else _prune(item, wild) for item in node]
    return node


def _loads(raw: msgspec.Raw) -> Any:
    return orjson.loads(memoryview(raw))


def _shape(trie: _Trie) -> tuple[Any, Callable[[Any], Any]]:
    """The msgspec type that decodes just what ``trie`` keeps, and the function turning what it
    decoded into plain values. An object level is a struct of the members named (the others are
    skipped by the decoder, never built), a list under ``*`` a list of its items' shape; a level
    the trie reads whole, or cannot describe (``*`` over an object's keys), stays raw JSON."""
    wild = trie.get(WILDCARD)
    if wild is not None:
        if len(trie) == 1 and wild is not _WHOLE:
            item_type, item = _shape(wild)
            return list[item_type], lambda value: [item(v) for v in value]  # type: ignore[valid-type]
        return msgspec.Raw, lambda value: _prune(_loads(value), trie)
    fields: list[tuple[str, Any, Any]] = []
    members: list[tuple[str, str, Callable[[Any], Any] | None]] = []
    for i, key in enumerate(sorted(trie)):
        sub = trie[key]
        name = f"m{i}"
        if sub is _WHOLE:
            fields.append((name, msgspec.Raw, msgspec.field(default=msgspec.Raw(b""), name=key)))
            members.append((name, key, None))
        else:
            sub_type, convert = _shape(sub)
            fields.append((name, sub_type | msgspec.UnsetType,
                           msgspec.field(default=msgspec.UNSET, name=key)))
            members.append((name, key, convert))
    unset = msgspec.UNSET

    def build(value: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, key, convert in members:
            member = getattr(value, name)
            if convert is None:
                if member:  # an empty Raw: absent
                    out[key] = orjson.loads(memoryview(member))
            elif member is not unset:
                out[key] = convert(member)
        return out

    return msgspec.defstruct("Members", fields), build


class _Plan:
    """How to decode, from JSON bytes, only what a trie keeps (the :func:`_prune` of the decoded
    value) in one pass of msgspec over the bytes, building nothing else (:func:`_shape`). Where the
    object's shape differs from the trie's (a null or a string where the path expects an object),
    the bytes are decoded whole and pruned: the same result, the slow way."""

    __slots__ = ("_build", "_decoder", "trie")

    def __init__(self, trie: _Trie) -> None:
        self.trie = trie
        shape, self._build = _shape(trie)
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(shape)

    def decode(self, raw: bytes) -> Any:
        try:
            decoded = self._decoder.decode(raw)
        except msgspec.ValidationError:
            return _prune(orjson.loads(raw), self.trie)
        return self._build(decoded)


def prune(obj: Mapping[str, Any], paths: Iterable[Path]) -> dict[str, Any]:
    """A plain copy of ``obj`` with only the subtrees at ``paths`` (``*`` matches every key or item)."""
    result: dict[str, Any] = _prune(obj, _trie(paths))
    return result


class Projection:
    """A sink's ``fields``: the object reduced to the configured paths."""

    __slots__ = ("_plan", "_trie", "attribute", "paths")

    def __init__(self, *, paths: Iterable[Path], texts: Iterable[str]) -> None:
        self.paths = tuple(paths)
        self._trie = _trie(self.paths)
        self._plan = _Plan(self._trie)
        self.attribute = ",".join(texts)
        """The ``fields`` extension attribute of a projected event: the paths as configured."""

    def apply(self, obj: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        if obj is None:
            return None
        if type(obj) is RawObject:  # kept as bytes: decode only what is sent
            projected: dict[str, Any] = self._plan.decode(obj.raw)
            return projected
        result: dict[str, Any] = _prune(obj, self._trie)
        return result


# ---- compiling ------------------------------------------------------------------------------------

_ENV: Any = None


def _env() -> Any:
    global _ENV
    if _ENV is None:
        variables = {
            "object": _cel.Type.DYN,
            "oldObject": _cel.Type.DYN,
            _INTERNAL["type"]: _cel.Type.STRING,
            "resource": _cel.Type.STRING,
            _INTERNAL["namespace"]: _cel.Type.STRING,
            "manager": _cel.Type.STRING,
        }
        _ENV = _cel.NewEnv(variables=variables,
                           extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()])
    return _ENV


_STATUS = re.compile(r"^[A-Z_]+: ")
_STATUS_TAIL = re.compile(r"\s*\[[A-Z_]+\]\s*$")


def _cel_message(text: str, source: str, renamed: str) -> str:
    """CEL's message without the status wrapping, quoting the expression as written."""
    text = _STATUS_TAIL.sub("", _STATUS.sub("", text.strip()))
    if renamed != source:
        for mine, theirs in zip(renamed.splitlines(), source.splitlines(), strict=False):
            if mine != theirs:
                text = text.replace(f"| {mine}", f"| {theirs}")
    return text


@dataclass(frozen=True, slots=True)
class CompiledExpression:
    source: str
    reads: Reads
    program: Any


_COMPILED: dict[str, CompiledExpression] = {}


def compile_expression(source: str) -> CompiledExpression:
    """Parses and type-checks ``source`` (once per distinct text); raises CelError with CEL's
    message and position."""
    found = _COMPILED.get(source)
    if found is not None:
        return found
    if not source.strip():
        raise CelError("empty expression")
    reads, renamed = read_expression(source)
    for tok in _tokens(source):
        if tok.kind == "ident" and tok.text in _INTERNAL.values():
            raise CelError(f"{tok.text!r} is reserved for the bridge's own use")
    try:
        program = _env().compile(renamed)
    except Exception as exc:  # the runtime raises its status as RuntimeError
        raise CelError(_cel_message(str(exc), source, renamed)) from None
    kind = program.return_type()
    if not (kind == _cel.Type.BOOL or kind == _cel.Type.DYN):  # noqa: PLR1714 (not hashable)
        raise CelError(f"the expression must be a condition (bool), not {kind.name().lower()}")
    compiled = CompiledExpression(source=source, reads=reads, program=program)
    _COMPILED[source] = compiled
    return compiled


# ---- evaluating -----------------------------------------------------------------------------------

_BOOL = _cel.Type.BOOL
_ERROR_TYPE = _cel.Type.ERROR


class CelFilter:
    """One compiled filter as the sinks sharing it (same expression, same redaction) apply it."""

    __slots__ = ("_last", "_last_verdict", "_needs_type", "_obj_plan", "_obj_trie", "_old_plan", "_old_trie",
                 "_program",
                 "_redactor", "_wants", "expression", "last_error", "logged")

    def __init__(self, *, expression: CompiledExpression, redactor: Redactor) -> None:
        self.expression = expression
        reads = expression.reads
        self._program = expression.program
        self._redactor = redactor
        self._wants = reads.variables
        self._needs_type = "type" in reads.variables
        self._obj_trie = None if reads.object_paths is None else _trie(reads.object_paths)
        self._old_trie = None if reads.old_paths is None else _trie(reads.old_paths)
        self._obj_plan = None if self._obj_trie is None else _Plan(self._obj_trie)
        self._old_plan = None if self._old_trie is None else _Plan(self._old_trie)
        self._last: ChangeEvent | None = None
        self._last_verdict = PASS
        self.last_error = ""
        """The message of the last evaluation error."""
        self.logged = False
        """Whether an evaluation error of this expression was logged (once per expression)."""

    @property
    def source(self) -> str:
        return self.expression.source

    def _view(self, obj: Mapping[str, Any] | None, plan: _Plan | None, event: ChangeEvent) -> Any:
        if obj is None:
            return None
        if plan is not None:
            obj = plan.decode(obj.raw) if type(obj) is RawObject else _prune(obj, plan.trie)
        shown = self._redactor.apply(obj, event.resource)
        return plain(shown) if shown is not None else None

    def decide(self, event: ChangeEvent) -> int:
        """PASS, FAIL or ERROR (then :attr:`last_error` says why) for ``event``; the verdict for the
        event given last is remembered, so sinks sharing this filter evaluate it once."""
        if event is self._last:
            return self._last_verdict
        verdict = self._evaluate(event)
        self._last = event
        self._last_verdict = verdict
        return verdict

    def _evaluate(self, event: ChangeEvent) -> int:
        obj = event.obj
        if obj is None and not self._needs_type:
            return PASS  # a marker passes a filter that does not name the event type
        wants = self._wants
        data: dict[str, Any] = {}
        try:
            if "object" in wants:
                data["object"] = self._view(obj, self._obj_plan, event)
            if "oldObject" in wants:
                data["oldObject"] = self._view(event.old, self._old_plan, event)
            if "type" in wants:
                data["_typ"] = event.type.value
            if "resource" in wants:
                data["resource"] = event.resource.qualified
            if "namespace" in wants:
                data["_nmspace_"] = event.namespace if obj is not None else ""
            if "manager" in wants:
                change = None
                if obj is not None:
                    change = obj.change if type(obj) is RawObject else last_change(obj)
                data["manager"] = change.manager if change is not None else ""
            value = self._program.eval(data=data)
            kind = value.type()
            if kind == _BOOL:
                return PASS if value.value() else FAIL
            if kind == _ERROR_TYPE:
                self.last_error = _cel_message(str(value.value()), "", "")
            else:
                self.last_error = f"the expression gave {kind.name().lower()}, not bool"
        except Exception as exc:  # an object CEL cannot take must not stop the sink
            self.last_error = f"{type(exc).__name__}: {exc}"
        return ERROR


_SHARED: dict[tuple[str, str], CelFilter] = {}


def shared_filter(source: str, *, redactor: Redactor, redaction_key: str) -> CelFilter:
    """The :class:`CelFilter` for ``source`` under the redaction described by ``redaction_key``:
    one per distinct pair, so sinks that would compute the same verdict compute it once."""
    key = (source, redaction_key)
    found = _SHARED.get(key)
    if found is None:
        found = _SHARED[key] = CelFilter(expression=compile_expression(source), redactor=redactor)
    return found
