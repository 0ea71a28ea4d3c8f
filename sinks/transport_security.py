"""Settings that weaken transport security, found at configuration time.

A sink refuses, unless its options say ``allow_insecure: true``, to turn TLS verification off or to
send credentials in plaintext to anything but a loopback address (the same host: nothing on the
network can read it). With ``allow_insecure: true`` it accepts them and warns at start and in
``check-config``. What counts, per sink kind: the sinks' ``insecure_settings`` methods.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

__all__ = ["InsecureSetting", "all_loopback", "is_loopback", "refusal"]

InsecureSetting = tuple[str, str]
"""``(field, what it does)``: e.g. ``("tls.insecure_skip_verify", "turns TLS verification off")``."""


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def all_loopback(addresses: list[str], default_scheme: str) -> bool:
    """Whether every address (a URL, or ``host:port``) is a loopback one."""
    for address in addresses:
        text = address if "://" in address else f"{default_scheme}://{address}"
        if not is_loopback(urllib.parse.urlsplit(text).hostname):
            return False
    return True


def refusal(settings: list[InsecureSetting]) -> str:
    """The configuration error for ``settings`` found without ``allow_insecure``."""
    return "; ".join(f"{name}: {what}" for name, what in settings) + (
        " — refused: use TLS (with verification), or set allow_insecure: true to accept it knowingly")
