"""The OpenAPI v2 document in protobuf, as kube-apiserver serves it to kubectl.

kubectl asks for ``/openapi/v2`` as ``application/com.github.proto-openapi.spec.v2@v1.0+protobuf`` (the
``openapi.v2.Document`` message of gnostic's ``OpenAPIv2.proto``) and cannot read JSON there; it still
needs v2 where v3 does not apply: validating a ``kind: List`` manifest, ``kubectl explain --output
plaintext-openapiv2``. This writes the message with a small protobuf encoder for the fields kubectl
reads: the swagger version, the info and every definition (schemas, with vendor extensions such as
``x-kubernetes-group-version-kind`` as YAML, which JSON text is).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["PROTOBUF_V2", "PROTOBUF_V2_CONTENT_TYPE", "encode_document"]

PROTOBUF_V2 = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
"""What kubectl puts in Accept."""
PROTOBUF_V2_CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
"""What the server answers with (a valid media type: no ``@``)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _uint(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _double(field: int, value: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", value)


def _any(field: int, value: Any) -> bytes:
    """gnostic's ``Any`` (its ``yaml`` field, 2)."""
    return _bytes(field, _str(2, orjson.dumps(value).decode()))


# Schema fields of openapi.v2.Schema by their JSON name: (number, kind).
_STRINGS = {"$ref": 1, "format": 2, "title": 3, "description": 4, "pattern": 13, "discriminator": 26}
_DOUBLES = {"multipleOf": 6, "maximum": 7, "minimum": 9}
_BOOLS = {"exclusiveMaximum": 8, "exclusiveMinimum": 10, "uniqueItems": 16, "readOnly": 27}
_INTS = {"maxLength": 11, "minLength": 12, "maxItems": 14, "minItems": 15, "maxProperties": 17,
         "minProperties": 18}


def _schema(node: Mapping[str, Any]) -> bytes:
    out = bytearray()
    for key, value in node.items():
        if key in _STRINGS and isinstance(value, str):
            text = "#/definitions/" + value if key == "$ref" and not value.startswith("#") else value
            out += _str(_STRINGS[key], text)
        elif key in _DOUBLES and isinstance(value, (int, float)):
            out += _double(_DOUBLES[key], float(value))
        elif key in _BOOLS and value is True:
            out += _uint(_BOOLS[key], 1)
        elif key in _INTS and isinstance(value, int) and value >= 0:
            out += _uint(_INTS[key], value)
        elif key == "default":
            out += _any(5, value)
        elif key == "example":
            out += _any(30, value)
        elif key == "required" and isinstance(value, list):
            for name in value:
                out += _str(19, str(name))
        elif key == "enum" and isinstance(value, list):
            for item in value:
                out += _any(20, item)
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out += _bytes(21, _bytes(1, _schema(value)))
            elif isinstance(value, bool):
                out += _bytes(21, _uint(2, int(value)))
        elif key == "type":
            types = value if isinstance(value, list) else [value]
            out += _bytes(22, b"".join(_str(1, str(t)) for t in types))
        elif key == "items" and isinstance(value, Mapping):
            out += _bytes(23, _bytes(1, _schema(value)))
        elif key == "allOf" and isinstance(value, list):
            for sub in value:
                out += _bytes(24, _schema(sub))
        elif key == "properties" and isinstance(value, Mapping):
            out += _bytes(25, b"".join(_bytes(1, _str(1, name) + _bytes(2, _schema(sub)))
                                       for name, sub in value.items()))
        elif key.startswith("x-"):
            out += _bytes(31, _str(1, key) + _any(2, value))
    return bytes(out)


def encode_document(doc: Mapping[str, Any]) -> bytes:
    """A Swagger 2.0 document (as :meth:`Schemas.v2` builds it) as an ``openapi.v2.Document``;
    definitions with bare or ``#/definitions/`` references alike."""
    info = doc.get("info") or {}
    out = bytearray(_str(1, str(doc.get("swagger", "2.0"))))
    out += _bytes(2, _str(1, str(info.get("title", ""))) + _str(2, str(info.get("version", ""))))
    definitions = doc.get("definitions") or {}
    out += _bytes(9, b"".join(_bytes(1, _str(1, name) + _bytes(2, _schema(schema)))
                              for name, schema in definitions.items()))
    return bytes(out)
