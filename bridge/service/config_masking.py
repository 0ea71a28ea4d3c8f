"""What ``check-config`` may print of a configuration: every secret masked, by where it came from
as well as by what it is called.

Masked (``***``):

- every value read from a ``${file:}`` reference (a mounted Secret), whatever its key is called;
- every value set through a ``KEB_…`` environment variable (the environment is where a Secret is
  injected), and any other string holding such a value;
- the user info (``user:password@``, ``nats://TOKEN@``) and the query string (``?token=``, ``&sig=``)
  of every URL, in sinks, ``checkpoint.nats_url`` and anywhere else;
- every header value but those of :data:`HARMLESS_HEADERS`;
- values under keys named like secrets (``password``, ``token``, ``hmac_secret`` …).

:class:`Origins` records the first two while the configuration loads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HARMLESS_HEADERS", "MASK", "Origins", "mask_config"]

MASK = "***"
HARMLESS_HEADERS = frozenset({
    "accept", "accept-encoding", "accept-language", "cache-control", "content-encoding",
    "content-language", "content-type", "user-agent", "ce-specversion", "ce-source", "ce-type",
})
"""Headers whose values are shown (lowercase); every other header's value is masked."""
_ENV_PREFIX = "KEB_"
_ENV_NOT_CONFIG = frozenset({"KEB_CONFIG_FILE", "KEB_ADMIN_TOKEN", "KEB_EXTRAS", "KEB_NEED_NATS"})
_MIN_SECRET = 4
"""Shorter values are masked where they were set, not searched for elsewhere (``true``, ``1``)."""

_SECRET_NAME = re.compile(
    r"(password|passwd|secret|token|credential|creds|nkey|seed|private|authorization|api_?key|"
    r"sasl\.oauthbearer\.config|ssl\.key\.pem)",
    re.IGNORECASE,
)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s,]*@)")
_QUERY = re.compile(r"(://[^\s,?#]*)\?[^\s,#]*")


@dataclass
class Origins:
    """Where secrets came from while loading: paths (``("sinks", 0, "url")``) whose value was read
    from a file or the environment, and the secret texts themselves."""

    paths: set[tuple[str | int, ...]] = field(default_factory=set)
    secrets: set[str] = field(default_factory=set)

    def file_value(self, path: tuple[str | int, ...], content: str) -> None:
        """The value at ``path`` holds ``content``, read from a file."""
        self.paths.add(path)
        self.secrets.add(content)

    def environment(self, environ: Mapping[str, str] | None = None) -> None:
        """The ``KEB_…`` variables that set configuration (``KEB_A__B`` sets ``a.b``)."""
        for name, value in (os.environ if environ is None else environ).items():
            if not name.upper().startswith(_ENV_PREFIX) or name.upper() in _ENV_NOT_CONFIG:
                continue
            path = tuple(p.lower() for p in name[len(_ENV_PREFIX):].split("__") if p)
            if path:
                self.paths.add(path)
                self.secrets.add(value)


def _mask_url(text: str) -> str:
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    return _QUERY.sub(lambda m: m.group(1) + "?" + MASK, text)


def _mask_all(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_all(v) for v in value]
    return value if value is None or isinstance(value, bool) else MASK


class _Masker:
    def __init__(self, origins: Origins) -> None:
        self._paths = origins.paths
        self._secrets = sorted((s for s in origins.secrets if len(s) >= _MIN_SECRET), key=len,
                               reverse=True)

    def mask(self, value: Any, path: tuple[str | int, ...] = (), key: str = "") -> Any:
        if path in self._paths:
            return _mask_all(value)
        if isinstance(value, dict):
            headers = key.lower() == "headers"
            return {k: (MASK if headers and str(k).lower() not in HARMLESS_HEADERS and v is not None
                        else self.mask(v, (*path, str(k)), str(k)))
                    for k, v in value.items()}
        if isinstance(value, list):
            return [self.mask(v, (*path, i), key) for i, v in enumerate(value)]
        if key and _SECRET_NAME.search(key) and not key.endswith("_file") and value not in (None, ""):
            return MASK
        if isinstance(value, str):
            for secret in self._secrets:
                if secret in value:
                    return MASK
            if "://" in value:
                return _mask_url(value)
        return value


def mask_config(raw: dict[str, Any], origins: Origins) -> dict[str, Any]:
    """``raw`` (the configuration as plain data) with every secret replaced by ``***``."""
    masked: dict[str, Any] = _Masker(origins).mask(raw)
    return masked
