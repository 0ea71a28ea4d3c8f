"""``check-config`` masks secrets by where they came from, not only by what their key is called:
a configuration full of marked secrets, one of each class, none of which may appear in what it
prints or logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

SECRETS = {
    "file": "FILESECRET01",          # ${file:} under a key not named like a secret
    "env": "ENVSECRET02",            # a KEB_ environment variable
    "env-json": "ENVJSONSECRET03",   # inside a JSON-valued KEB_ variable
    "query": "QUERYSECRET04",        # ?token=
    "sig": "SIGSECRET05",            # &sig=
    "userinfo": "USERPASS06",        # https://user:PASS@
    "nats-token": "NATSTOKEN07",     # nats://TOKEN@ (a sink's servers)
    "checkpoint-token": "CPTOKEN08",  # nats://TOKEN@ (checkpoint.nats_url)
    "cookie": "COOKIESECRET09",      # Cookie header
    "x-auth": "XAUTHSECRET10",       # X-…-Auth header
    "named": "NAMEDSECRET11",        # a key named like a secret (as before)
}


def test_no_marked_secret_reaches_the_output_or_the_log(tmp_path: Path) -> None:
    secret_file = tmp_path / "destination"
    secret_file.write_text(SECRETS["file"] + "\n")
    config = {
        "resources": [{"resource": "pods"}],
        "sinks": [
            {"name": "hook", "kind": "webhook",
             "url": f"https://bridge:{SECRETS['userinfo']}@hooks.example.com/in"
                    f"?token={SECRETS['query']}&sig={SECRETS['sig']}",
             "destination": f"${{file:{secret_file}}}",
             "headers": {"Cookie": f"session={SECRETS['cookie']}", "X-Tenant-Auth": SECRETS["x-auth"],
                         "Content-Type": "application/cloudevents+json"},
             "hmac_secret": SECRETS["named"]},
            {"name": "bus", "kind": "nats", "servers": [f"nats://{SECRETS['nats-token']}@127.0.0.1:4222"],
             "destination": "k8s"},
        ],
        "checkpoint": {"store": "nats-kv", "nats_url": f"nats://{SECRETS['checkpoint-token']}@127.0.0.1:4222"},
    }
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEB_")}
    env["KEB_CHECKPOINT__BUCKET"] = SECRETS["env"]
    env["KEB_EVENTS"] = f'{{"enrichment": {{"annotations": ["{SECRETS["env-json"]}"]}}}}'
    done = subprocess.run([sys.executable, "-m", "bridge.service.cli", "check-config", "-c", str(path)],
                          check=False, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)
    for kind, secret in SECRETS.items():
        assert secret not in done.stdout, f"{kind} secret printed"
        assert secret not in done.stderr, f"{kind} secret logged"
    hook, bus = printed["sinks"]
    assert hook["url"] == "https://***@hooks.example.com/in?***"
    assert hook["destination"] == "***"
    assert hook["headers"] == {"Cookie": "***", "X-Tenant-Auth": "***",
                               "Content-Type": "application/cloudevents+json"}
    assert bus["servers"] == ["nats://***@127.0.0.1:4222"]
    assert printed["checkpoint"]["nats_url"] == "nats://***@127.0.0.1:4222"
    assert printed["checkpoint"]["bucket"] == "***"
    assert printed["checkpoint"]["store"] == "nats-kv"  # what no secret touches is shown
    assert printed["events"]["enrichment"]["annotations"] == ["***"]
