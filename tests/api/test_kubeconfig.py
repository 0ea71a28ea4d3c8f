"""Configuration and auth: kubeconfig contexts, tokens, exec plugins, client certificates, custom and
wrong CAs, insecure-skip-tls-verify, in-cluster token rotation, and malformed kubeconfigs giving a
ConfigurationError that names the file and the problem (and never a credential)."""

from __future__ import annotations

import base64
import json
import stat
import sys
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from bridge.clock import FakeClock
from bridge.errors import ApiUnavailableError, ConfigurationError
from bridge.kube.apiclient import ApiClient, ApiClientOptions
from bridge.kube.kubeconfig import load_kubeconfig

from .conftest import Certs, ScriptedServer

SECRET = "kubeconfig-secret-token-123"


async def whoami(request: web.Request) -> web.StreamResponse:
    return web.json_response({"authorization": request.headers.get("Authorization")})


def write_kubeconfig(path: Path, *, clusters: dict[str, dict[str, object]],
                     users: dict[str, dict[str, object]], contexts: dict[str, tuple[str, str]],
                     current: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": {"cluster": c, "user": u}} for n, (c, u) in contexts.items()],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_context_selection_picks_server_and_user(server: ScriptedServer, tmp_path: Path) -> None:
    server.handler = whoami
    url = await server.start()
    other = ScriptedServer(handler=whoami)
    other_url = await other.start()
    try:
        kc = write_kubeconfig(
            tmp_path / "config",
            clusters={"one": {"server": url}, "two": {"server": other_url}},
            users={"alice": {"token": "alice-token"}, "bob": {"token": "bob-token"}},
            contexts={"a": ("one", "alice"), "b": ("two", "bob")},
            current="a",
        )
        async with ApiClient.from_kubeconfig(str(kc)) as client:
            assert await client.get_json("/api") == {"authorization": "Bearer alice-token"}
        async with ApiClient.from_kubeconfig(str(kc), context="b") as client:
            assert await client.get_json("/api") == {"authorization": "Bearer bob-token"}
            assert "bob-token" not in repr(client)
    finally:
        await other.stop()
    assert len(server.requests) == 1
    assert len(other.requests) == 1


async def test_kubeconfig_env_variable_is_used(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.handler = whoami
    url = await server.start()
    kc = write_kubeconfig(tmp_path / "cfg", clusters={"c": {"server": url}}, users={"u": {"token": "t1"}},
                          contexts={"ctx": ("c", "u")}, current="ctx")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    async with ApiClient.auto() as client:
        assert await client.get_json("/api") == {"authorization": "Bearer t1"}


async def test_token_file_in_kubeconfig(server: ScriptedServer, tmp_path: Path) -> None:
    server.handler = whoami
    url = await server.start()
    (tmp_path / "tok").write_text("from-file\n")
    kc = write_kubeconfig(tmp_path / "cfg", clusters={"c": {"server": url}},
                          users={"u": {"tokenFile": str(tmp_path / "tok")}},
                          contexts={"ctx": ("c", "u")}, current="ctx")
    async with ApiClient.from_kubeconfig(str(kc)) as client:
        assert await client.get_json("/api") == {"authorization": "Bearer from-file"}


def exec_plugin(tmp_path: Path) -> Path:
    """An exec credential plugin that hands out tok-1, tok-2, … (one per run)."""
    script = tmp_path / "plugin.py"
    counter = tmp_path / "runs"
    script.write_text(
        "import json, pathlib\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential',"
        " 'status': {'token': f'tok-{n}'}}))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


async def test_exec_plugin_token_and_rerun_after_401(server: ScriptedServer, tmp_path: Path) -> None:
    async def accept_second(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") == "Bearer tok-2":
            return web.json_response({"ok": True})
        return web.json_response({"kind": "Status", "code": 401, "message": "Unauthorized"}, status=401)

    server.handler = accept_second
    url = await server.start()
    script = exec_plugin(tmp_path)
    kc = write_kubeconfig(
        tmp_path / "cfg",
        clusters={"c": {"server": url}},
        users={"u": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                              "command": sys.executable, "args": [str(script)]}}},
        contexts={"ctx": ("c", "u")}, current="ctx",
    )
    async with ApiClient.from_kubeconfig(str(kc)) as client:
        assert await client.get_json("/api") == {"ok": True}
    assert [r.authorization for r in server.requests] == ["Bearer tok-1", "Bearer tok-2"]
    assert (tmp_path / "runs").read_text() == "2"


async def test_client_certificate_and_custom_ca(server: ScriptedServer, certs: Certs, tmp_path: Path) -> None:
    server.handler = whoami
    url = await server.start(certs.server_context(require_client_cert=True))

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    kc = write_kubeconfig(
        tmp_path / "cfg",
        clusters={"tls": {"server": url, "certificate-authority": str(certs.ca)}},
        users={"cert-user": {"client-certificate-data": b64(certs.client_cert),
                             "client-key-data": b64(certs.client_key)}},
        contexts={"ctx": ("tls", "cert-user")}, current="ctx",
    )
    async with ApiClient.from_kubeconfig(str(kc)) as client:
        assert await client.get_json("/api") == {"authorization": None}
    # Direct construction with files works the same way.
    async with ApiClient(server=url, ca_file=str(certs.ca), cert_file=str(certs.client_cert),
                         key_file=str(certs.client_key)) as client:
        assert await client.get_json("/api") == {"authorization": None}
    assert len(server.requests) == 2


async def test_wrong_ca_fails_tls_and_insecure_skip_verify_passes(
    server: ScriptedServer, certs: Certs, tmp_path: Path
) -> None:
    server.handler = whoami
    url = await server.start(certs.server_context())
    async with ApiClient(server=url, ca_file=str(certs.other_ca), token=SECRET) as client:
        with pytest.raises(ApiUnavailableError, match=r"TLS verification of .* failed") as info:
            await client.get_json("/api")
    assert SECRET not in str(info.value)
    kc = write_kubeconfig(tmp_path / "cfg",
                          clusters={"c": {"server": url, "insecure-skip-tls-verify": True}},
                          users={"u": {"token": "t"}}, contexts={"ctx": ("c", "u")}, current="ctx")
    async with ApiClient.from_kubeconfig(str(kc)) as client:
        assert await client.get_json("/api") == {"authorization": "Bearer t"}
    assert len(server.requests) == 1


async def test_in_cluster_token_rotation(server: ScriptedServer, certs: Certs, tmp_path: Path) -> None:
    server.handler = whoami
    url = await server.start(certs.server_context())
    port = url.rsplit(":", 1)[1]
    token = tmp_path / "token"
    token.write_text("sa-token-1")
    clock = FakeClock()
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    client = ApiClient.in_cluster(token_file=str(token), ca_file=str(certs.ca), environ=env, clock=clock,
                                  options=ApiClientOptions(token_refresh_interval=60))
    async with client:
        assert client.server == f"https://127.0.0.1:{port}"
        assert await client.get_json("/api") == {"authorization": "Bearer sa-token-1"}
        token.write_text("sa-token-2")
        await clock.advance(30)
        assert await client.get_json("/api") == {"authorization": "Bearer sa-token-1"}
        await clock.advance(31)
        assert await client.get_json("/api") == {"authorization": "Bearer sa-token-2"}
        assert "sa-token" not in repr(client)


def test_in_cluster_without_environment_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="in-cluster configuration: Service host/port is not set"):
        ApiClient.in_cluster(token_file=str(tmp_path / "t"), ca_file=str(tmp_path / "ca"), environ={})


# --------------------------------------------------------------------------------------------------
# malformed kubeconfigs


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=f"^kubeconfig {tmp_path}/nope: file does not exist"):
        ApiClient.from_kubeconfig(str(tmp_path / "nope"))


def test_invalid_yaml_names_the_position_not_the_content(tmp_path: Path) -> None:
    kc = tmp_path / "broken"
    kc.write_text(f"apiVersion: v1\nusers:\n- name: u\n  user:\n    token: {SECRET}\n   bad: [\n")
    with pytest.raises(ConfigurationError) as info:
        ApiClient.from_kubeconfig(str(kc))
    message = str(info.value)
    assert message.startswith(f"kubeconfig {kc}: not valid YAML: ")
    assert "line 6" in message
    assert SECRET not in message
    assert isinstance(info.value.__cause__, yaml.YAMLError)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "the file is empty"),
        ("- a\n- b\n", "expected a mapping with clusters, contexts and users, found a list"),
        ("clusters: {}\n", "'clusters' must be a list"),
        ("contexts:\n- context: {}\n", "every entry of 'contexts' needs a 'name'"),
        ("contexts: []\nclusters: []\n",
         "no current-context and no context chosen (available contexts: none)"),
    ],
)
def test_malformed_structure(tmp_path: Path, content: str, problem: str) -> None:
    kc = tmp_path / "config"
    kc.write_text(content)
    with pytest.raises(ConfigurationError) as info:
        load_kubeconfig(str(kc))
    assert str(info.value) == f"kubeconfig {kc}: {problem}"


def test_unknown_context_lists_the_available_ones(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "cfg", clusters={"c": {"server": "http://127.0.0.1:1"}},
                          users={"u": {"token": SECRET}}, contexts={"dev": ("c", "u"), "prod": ("c", "u")},
                          current="dev")
    with pytest.raises(ConfigurationError) as info:
        ApiClient.from_kubeconfig(str(kc), context="staging")
    assert str(info.value) == f"kubeconfig {kc}: context 'staging' not found (available contexts: dev, prod)"


@pytest.mark.parametrize(
    ("cluster", "users", "problem"),
    [
        ({}, {"u": {}}, "cluster 'c' has no 'server' URL"),
        ({"server": "127.0.0.1:6443"}, {"u": {}},
         "cluster 'c' server '127.0.0.1:6443' must start with http:// or https://"),
        ({"server": "http://x"}, {"someone-else": {}},
         "context 'ctx' refers to user 'u', which is not defined"),
    ],
)
def test_bad_cluster_or_user(tmp_path: Path, cluster: dict[str, object], users: dict[str, dict[str, object]],
                             problem: str) -> None:
    kc = write_kubeconfig(tmp_path / "cfg", clusters={"c": cluster}, users=users,
                          contexts={"ctx": ("c", "u")}, current="ctx")
    with pytest.raises(ConfigurationError) as info:
        load_kubeconfig(str(kc))
    assert str(info.value) == f"kubeconfig {kc}: {problem}"


def test_missing_cluster_reference(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "cfg", clusters={"real": {"server": "http://x"}}, users={"u": {}},
                          contexts={"ctx": ("ghost", "u")}, current="ctx")
    with pytest.raises(ConfigurationError) as info:
        load_kubeconfig(str(kc))
    assert str(info.value) == (
        f"kubeconfig {kc}: context 'ctx' refers to cluster 'ghost', which is not defined (clusters: real)"
    )


def test_unreadable_ca_file_is_a_configuration_error(tmp_path: Path) -> None:
    pattern = r"TLS configuration for https://127\.0\.0\.1:1: cannot load CA"
    with pytest.raises(ConfigurationError, match=pattern):
        ApiClient(server="https://127.0.0.1:1", ca_file=str(tmp_path / "missing.crt"))


def test_exec_plugin_failure_is_reported_without_secrets(tmp_path: Path) -> None:
    kc = write_kubeconfig(
        tmp_path / "cfg",
        clusters={"c": {"server": "http://127.0.0.1:1"}},
        users={"u": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "false"}}},
        contexts={"ctx": ("c", "u")}, current="ctx",
    )
    loaded = load_kubeconfig(str(kc))
    # The kubernetes package logs the failed plugin and carries on without credentials.
    assert loaded.token_source is None
    assert loaded.cluster.server == "http://127.0.0.1:1"
    assert json.dumps(loaded.cluster.source) == json.dumps(f"kubeconfig {kc} (context ctx)")


async def test_exec_plugin_rerun_when_its_credential_expired(server: ScriptedServer, tmp_path: Path) -> None:
    server.handler = whoami
    url = await server.start()
    script = tmp_path / "expiring.py"
    counter = tmp_path / "runs"
    script.write_text(
        "import json, pathlib\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential',"
        " 'status': {'token': f'exp-{n}', 'expirationTimestamp': '2000-01-01T00:00:00Z'}}))\n"
    )
    kc = write_kubeconfig(
        tmp_path / "cfg",
        clusters={"c": {"server": url}},
        users={"u": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                              "command": sys.executable, "args": [str(script)]}}},
        contexts={"ctx": ("c", "u")}, current="ctx",
    )
    async with ApiClient.from_kubeconfig(str(kc)) as client:
        first = await client.get_json("/api")
        second = await client.get_json("/api")
    # Loading ran the plugin once (exp-1); each request found that credential expired and re-ran it.
    assert (first, second) == ({"authorization": "Bearer exp-2"}, {"authorization": "Bearer exp-3"})
