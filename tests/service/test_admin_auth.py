"""The admin listener: mutating endpoints apart from the public port, loopback by default, a bearer
token when configured (read on every request, so a rotated Secret applies at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from bridge.errors import ConfigurationError
from bridge.service.cli import main as cli_main
from bridge.service.config import load_config
from bridge.service.health import HealthServer, Readiness


def _server(token_file: str | None, calls: list[str | None]) -> HealthServer:
    async def snapshot(resource: str | None) -> list[str]:
        calls.append(resource)
        return [resource or "pods"]

    return HealthServer(host="127.0.0.1", port=0, readiness=lambda: Readiness(True), metrics=lambda: b"",
                        snapshot=snapshot, admin_host="127.0.0.1", admin_port=0,
                        admin_token_file=token_file)


async def test_snapshot_is_refused_on_the_public_port_and_served_on_the_admin_one() -> None:
    calls: list[str | None] = []
    server = _server(None, calls)
    await server.start()
    try:
        assert server.admin_port not in (0, server.port)
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{server.port}/snapshot") as r:
                assert r.status == 403
            async with s.get(f"http://127.0.0.1:{server.admin_port}/metrics") as r:
                assert r.status == 404  # the admin listener serves the admin endpoints only
            async with s.post(f"http://127.0.0.1:{server.admin_port}/snapshot?resource=pods") as r:
                assert r.status == 202
        assert calls == ["pods"]
    finally:
        await server.stop()


async def test_a_token_is_required_and_reread_on_every_request(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    calls: list[str | None] = []
    server = _server(str(token), calls)
    await server.start()
    url = f"http://127.0.0.1:{server.admin_port}/snapshot"
    try:
        async with aiohttp.ClientSession() as s:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic first-token"},
                            {"Authorization": "Bearer first-token-and-more"}):
                async with s.post(url, headers=headers) as r:
                    assert r.status == 401, headers
                    assert r.headers["WWW-Authenticate"] == "Bearer"
            async with s.post(url, headers={"Authorization": "Bearer first-token"}) as r:
                assert r.status == 202
            token.write_text("second-token")  # the Secret rotated
            async with s.post(url, headers={"Authorization": "Bearer first-token"}) as r:
                assert r.status == 401
        assert calls == [None]
        # The CLI: refused without the token, accepted with --token-file.
        admin = f"http://127.0.0.1:{server.admin_port}"
        assert await asyncio.to_thread(cli_main, ["snapshot", "--url", admin]) == 1
        with_token = ["snapshot", "--url", admin, "--token-file", str(token)]
        assert await asyncio.to_thread(cli_main, with_token) == 0
        assert calls == [None, None]
        assert await asyncio.to_thread(cli_main, ["snapshot", "--token-file", str(tmp_path / "nope")]) == 2
    finally:
        await server.stop()


BASE = "resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\n"


@pytest.mark.parametrize(("server", "error"), [
    ("{admin_host: 0.0.0.0}",
     r"server: admin_host '0\.0\.0\.0' is reachable from other pods: set admin_token_file"),
    ("{admin_token_file: /nonexistent/token}", r"server: admin_token_file: cannot read /nonexistent/token"),
    ("{port: 9000, admin_port: 9000, admin_host: 0.0.0.0, host: 0.0.0.0, admin_token_file: TOKEN}",
     r"server: admin_port must differ from port"),
])
def test_admin_listener_configuration_errors_name_the_field(tmp_path: Path, server: str, error: str) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    path = tmp_path / "c.yaml"
    path.write_text(BASE + f"server: {server.replace('TOKEN', str(token))}\n")
    with pytest.raises(ConfigurationError, match=error):
        load_config(path)
    assert cli_main(["check-config", "-c", str(path)]) == 2
