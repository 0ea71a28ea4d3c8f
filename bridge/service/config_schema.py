"""The configuration's JSON Schema, generated from the pydantic models that validate it.

One source of truth: :class:`~bridge.service.config.BridgeConfig` and each sink kind's options model
(``KafkaSinkOptions``, ``WebhookOptions`` …) decide what a valid configuration is, and this module
turns them into a JSON Schema (draft-07, the dialect every Helm version reads). The Helm chart embeds
it under ``config`` in its ``values.schema.json``, so ``helm install``/``template``/``lint`` reject a
misspelled key, an unknown sink kind or a sink missing a required option before anything runs.
``scripts/gen-chart-schema`` writes it; ``tests/service/test_chart_schema.py`` fails when the
committed schema and the models disagree.

A sink entry is checked against the options model of its ``kind`` (``if kind == "kafka" then …``).
The kinds are those installed when the schema is generated (built-in ones and plugins found through
the ``kube_event_bridge.sinks`` entry points); a plugin whose factory is not a
:class:`~sinks.base.BaseSink` gets ``name`` and ``kind`` checked only.

What JSON Schema cannot say (one value compared with another: ``lease_duration > renew_deadline``,
``max >= initial``) is checked by the chart's templates where the chart owns the values
(``leaderElection``), and otherwise by ``kube-event-bridge check-config``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import AliasChoices, BaseModel

from bridge.service.config import SINK_NAME_PATTERN, BridgeConfig
from sinks.options import SinkOptions

__all__ = [
    "CHART_OWNED_KEYS",
    "DEFINITIONS",
    "bridge_config_schema",
    "builtin_resources_template",
    "chart_values_schema",
    "render_json",
    "sink_options_models",
]

DEFINITIONS = "definitions"
_REF = f"#/{DEFINITIONS}/{{model}}"

CHART_OWNED_KEYS = ("server", "leader_election")
"""Configuration keys the chart fills in from its own values (``metrics.port``, ``leaderElection``);
setting them under ``config`` is an error rather than silently overwritten — except the admin
listener's keys below, which stay the user's."""

USER_SERVER_KEYS = ("admin_host", "admin_port", "admin_token_file")
"""``server`` keys the chart leaves to the user's ``config``: the admin listener (/snapshot)."""


def sink_options_models() -> dict[str, type[SinkOptions] | None]:
    """Installed sink kind → its options model (None when the kind is not a BaseSink)."""
    from sinks.base import BaseSink
    from sinks.registry import known_kinds, load_factory

    out: dict[str, type[SinkOptions] | None] = {}
    for kind in known_kinds():
        factory = load_factory(kind)
        owner = getattr(factory, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, BaseSink):
            out[kind] = owner.options_model
        else:
            out[kind] = None
    return out


_NAME_MAPS = ("properties", "patternProperties", "definitions", "$defs")
"""Keywords whose value maps names (of options, of definitions) to schemas."""


def _strip(node: Any, *, names: bool = False) -> Any:
    """Drops what only decorates (``title``) and pydantic's OpenAPI ``discriminator`` from every
    schema; an option that happens to be called ``title`` is kept (``names``: ``node`` maps names
    to schemas)."""
    if isinstance(node, dict):
        if names:
            return {k: _strip(v) for k, v in node.items()}
        return {k: _strip(v, names=k in _NAME_MAPS) for k, v in node.items()
                if k not in ("title", "discriminator")}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _model_schema(model: type[BaseModel], defs: dict[str, Any]) -> dict[str, Any]:
    """``model``'s schema with its sub-models moved into ``defs`` and every alias spelled out."""
    schema: dict[str, Any] = model.model_json_schema(ref_template=_REF, mode="validation")
    defs.update(schema.pop("$defs", {}))
    _add_aliases(model, schema)
    return schema


def _add_aliases(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """pydantic lists only the first of a field's ``AliasChoices``: the others are valid too."""
    props = schema.get("properties", {})
    required: list[str] = schema.get("required", [])
    for field in model.model_fields.values():
        alias = field.validation_alias
        if not isinstance(alias, AliasChoices):
            continue
        names = [c for c in alias.choices if isinstance(c, str)]
        first = names[0]
        for other in names[1:]:
            props[other] = props[first]
        if first in required:
            required.remove(first)
            schema.setdefault("allOf", []).append({"anyOf": [{"required": [n]} for n in names]})
    if "required" in schema and not required:
        del schema["required"]


def _sink_schema(kind: str, model: type[SinkOptions], defs: dict[str, Any]) -> dict[str, Any]:
    schema = _model_schema(model, defs)
    schema["properties"] = {"name": {"type": "string"}, "kind": {"const": kind}, **schema["properties"]}
    schema["additionalProperties"] = False
    schema["description"] = f"A sink of kind {kind!r}: name, kind and the options of {model.__name__}."
    return schema


def bridge_config_schema() -> dict[str, Any]:
    """The JSON Schema of a configuration file: ``{"definitions": …, "config": …}``; ``config``'s
    references point at ``#/definitions/…`` of the document that embeds both."""
    defs: dict[str, Any] = {}
    config = _model_schema(BridgeConfig, defs)
    for key in CHART_OWNED_KEYS:
        config["properties"].pop(key, None)
    server = defs["ServerConfig"]["properties"]
    config["properties"]["server"] = {
        "type": "object",
        "additionalProperties": False,
        "description": "Only the admin listener's keys: the public listener is the chart's (metrics.port).",
        "properties": {k: server[k] for k in USER_SERVER_KEYS},
    }
    kinds = sink_options_models()
    branches: list[dict[str, Any]] = []
    for kind, model in kinds.items():
        if model is None:
            continue
        name = f"Sink_{kind}"
        defs[name] = _sink_schema(kind, model, defs)
        branches.append({"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                         "then": {"$ref": _REF.format(model=name)}})
    sink = defs["SinkConfig"]
    sink["properties"]["name"]["pattern"] = SINK_NAME_PATTERN
    sink["properties"]["kind"] = {"enum": sorted(kinds),
                                  "description": "The sink kind: one of the kinds installed."}
    sink["allOf"] = branches
    sink.pop("additionalProperties", None)  # each kind's branch forbids unknown options
    out: dict[str, Any] = _strip({DEFINITIONS: dict(sorted(copy.deepcopy(defs).items())), "config": config})
    return out


CHART_SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "creds", "nkey", "seed",
                      "private", "authorization", "cookie", "api_key", "apikey", "api-key")
"""Option names, header names and librdkafka property names (any case) the chart takes only as a
``${file:…}`` reference: their values would otherwise sit in clear text in the chart's ConfigMap."""

SECRET_MAPS = ("headers", "librdkafka")
"""String maps whose secret-named keys take only a ``${file:…}`` reference."""

FILE_REF_PATTERN = r"^\$\{file:/[^}]+\}$"
"""A value that is exactly one ``${file:/absolute/path}`` reference (a mounted Secret's key)."""
MAP_REF_PATTERN = r"^([A-Za-z][-A-Za-z0-9]* )?\$\{file:/[^}]+\}$"
"""A secret-named header or property: one reference, after a scheme word (``Bearer ${file:…}``)."""


def _any_case(word: str) -> str:
    """``word`` as a regular expression matching it in any case, without flags (JSON Schema's
    regular expressions have none)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


SECRET_KEY_PATTERN = "(" + "|".join(_any_case(w) for w in CHART_SECRET_WORDS) + ")"


def _is_secret_option(name: str) -> bool:
    lowered = name.lower()
    return (any(w in lowered for w in CHART_SECRET_WORDS)
            and not lowered.endswith(("_file", "_files")))


def _file_refs_only(node: Any) -> None:
    """Restricts, in place, every string option named like a secret (``hmac_secret``,
    ``bearer_token``, ``password``) to a ``${file:…}`` reference, and so the secret-named keys of
    :data:`SECRET_MAPS`; other types (``redact.secrets: true``) and ``*_file`` options stay."""
    if isinstance(node, list):
        for item in node:
            _file_refs_only(item)
        return
    if not isinstance(node, dict):
        return
    for name, prop in (node.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        if _is_secret_option(name):
            _refs_for_strings(prop)
        elif name in SECRET_MAPS and prop.get("type") == "object":
            prop["patternProperties"] = {SECRET_KEY_PATTERN: {
                "type": "string", "pattern": MAP_REF_PATTERN,
                "description": "A secret: only as a ${file:/path} reference to a mounted Secret "
                               "(secretMounts)."}}
    for value in node.values():
        _file_refs_only(value)


def _refs_for_strings(prop: dict[str, Any]) -> None:
    strings = [b for b in prop.get("anyOf", [prop]) if b.get("type") == "string"]
    for branch in strings:
        branch["pattern"] = FILE_REF_PATTERN
    if strings:
            prop["description"] = ("A secret: only as a ${file:/path} reference to a mounted Secret "
                               "(secretMounts), never inline in the chart's ConfigMap.")


def chart_values_schema(current: dict[str, Any]) -> dict[str, Any]:
    """The chart's values schema ``current`` with ``properties.config`` and ``definitions`` replaced
    by the generated ones (the rest of the chart's schema is written by hand). Secrets are taken
    only as files there (:func:`_file_refs_only`): the bridge itself still reads an inline value
    from a configuration file of its own."""
    generated = bridge_config_schema()
    _file_refs_only(generated)
    out = {k: v for k, v in current.items() if k != DEFINITIONS}
    out["properties"] = {**current["properties"], "config": generated["config"]}
    out[DEFINITIONS] = generated[DEFINITIONS]
    return out


def render_json(schema: dict[str, Any]) -> str:
    """The committed file's exact text (stable order, two-space indent, final newline)."""
    import json

    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def builtin_resources_template() -> str:
    """The chart's ``_builtin_resources.tpl``: every name of a built-in resource the bridge accepts,
    mapped to its plural and API group (RBAC rules need those), from
    :data:`~bridge.service.resource_names.BUILTIN_RESOURCES`."""
    import yaml

    from bridge.service.resource_names import BUILTIN_RESOURCES, resolve_builtin

    bare: dict[str, dict[str, str]] = {}
    qualified: dict[str, dict[str, str]] = {}
    for r in BUILTIN_RESOURCES:
        for name in (r.plural, r.singular, *r.short_names):
            found = resolve_builtin(name)
            assert found is not None
            bare.setdefault(name, {"group": found.group, "resource": found.plural})
            if r.group:
                qualified[f"{name}.{r.group}"] = {"group": r.group, "resource": r.plural}
    table = {
        "groups": sorted({r.group for r in BUILTIN_RESOURCES if r.group}),
        "bare": dict(sorted(bare.items())),
        "qualified": dict(sorted(qualified.items())),
    }
    body = yaml.safe_dump(table, sort_keys=False, default_flow_style=None, width=120)
    return (
        "{{/* Generated by scripts/gen-chart-schema from bridge/service/resource_names.py: do not edit.\n"
        "Every name of a built-in resource the bridge accepts (plural, singular, kind, short name, each\n"
        "also as <name>.<group>), mapped to its plural and API group. */}}\n"
        '{{- define "kube-event-bridge.builtinResources" -}}\n'
        f"{body}"
        "{{- end -}}\n"
    )
