"""Configuration loading: YAML + environment, file references, one clear message per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import ConfigurationError
from bridge.service.config import MASK, load_config, masked_dump

GOOD = """
cluster: prod
resources:
  - resource: pods
  - resource: deployments.apps
    namespace: web
    label_selector: "app in (a,b)"
sinks:
  - name: audit
    kind: kafka
    bootstrap_servers: "kafka:9092"
    librdkafka:
      sasl.password: hunter2
      sasl.username: bridge
  - name: hook
    kind: webhook
    url: "https://user:s3cret@hooks.example.com/in"
    hmac_secret: topsecret
    hmac_secret_file: /var/run/secrets/hook/key
checkpoint:
  store: file
  directory: /tmp/cp
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_good_config_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.cluster == "prod"
    assert [r.resource for r in cfg.resources] == ["pods", "deployments.apps"]
    assert cfg.resources[1].namespace == "web"
    assert cfg.sinks[0].options()["bootstrap_servers"] == "kafka:9092"
    assert cfg.checkpoint.interval == 5.0
    assert cfg.leader_election.enabled is False
    assert cfg.server.port == 8080
    assert cfg.shutdown_deadline == 25.0
    assert (cfg.kubernetes.qps, cfg.kubernetes.burst) == (50.0, 100)


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEB_CHECKPOINT__STORE", "configmap")
    monkeypatch.setenv("KEB_LOGGING__LEVEL", "debug")
    monkeypatch.setenv("KEB_CLUSTER", "staging")
    monkeypatch.setenv("KEB_KUBERNETES__QPS", "-1")
    monkeypatch.setenv("KEB_KUBERNETES__BURST", "7")
    cfg = load_config(write(tmp_path, GOOD))
    assert (cfg.kubernetes.qps, cfg.kubernetes.burst) == (-1.0, 7)
    assert cfg.checkpoint.store == "configmap"
    assert cfg.checkpoint.directory == "/tmp/cp"  # nested keys merge, not replace
    assert cfg.logging.level == "debug"
    assert cfg.cluster == "staging"


def test_only_a_page_size_the_configuration_sets_is_handed_to_the_informers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25 (client-go's WatchListPageSize pages every relist once set): left out, the informers
    get None, so relists at a known resourceVersion stay unpaginated for the watch cache."""
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.kubernetes.page_size == 500
    assert cfg.kubernetes.configured_page_size is None
    cfg = load_config(write(tmp_path, GOOD + "kubernetes:\n  page_size: 500\n"))
    assert cfg.kubernetes.configured_page_size == 500
    monkeypatch.setenv("KEB_KUBERNETES__PAGE_SIZE", "200")
    assert load_config(write(tmp_path, GOOD)).kubernetes.configured_page_size == 200


def test_the_node_strategy_reads_its_node_from_the_downward_api(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "worker-3.example")
    text = "resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\nsharding: {strategy: node}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.sharding.node_name == "worker-3.example"
    assert cfg.sharding.node_field_selector == "spec.nodeName=worker-3.example"
    assert not cfg.sharding.enabled
    owner = load_config(write(tmp_path, text.replace("{strategy: node}",
                                                     "{strategy: node, unscheduled: true}")))
    assert (owner.sharding.node_name, owner.sharding.node_field_selector) == ("", "spec.nodeName=")


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEB_CONFIG_FILE", str(write(tmp_path, GOOD)))
    assert load_config().cluster == "prod"


def test_file_references_are_resolved(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-a-secret\n")
    text = GOOD.replace("hunter2", f"${{file:{secret}}}")
    cfg = load_config(write(tmp_path, text))
    assert cfg.sinks[0].options()["librdkafka"]["sasl.password"] == "from-a-secret"


def test_missing_secret_file_is_a_clear_error(tmp_path: Path) -> None:
    text = GOOD.replace("hunter2", "${file:/nonexistent/pw}")
    with pytest.raises(ConfigurationError, match=r"sinks\.0\.librdkafka\.sasl\.password: cannot read"):
        load_config(write(tmp_path, text))


def test_masked_dump_hides_secrets_but_not_file_paths(tmp_path: Path) -> None:
    dump = masked_dump(load_config(write(tmp_path, GOOD)))
    kafka, hook = dump["sinks"]
    assert kafka["librdkafka"]["sasl.password"] == MASK
    assert kafka["librdkafka"]["sasl.username"] == "bridge"
    assert hook["hmac_secret"] == MASK
    assert hook["hmac_secret_file"] == "/var/run/secrets/hook/key"
    assert hook["url"] == f"https://{MASK}@hooks.example.com/in"  # the whole user info
    for secret in ("hunter2", "s3cret", "topsecret"):
        assert secret not in repr(dump)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("resources: [{resource: pods}]\n", r"sinks: required field is missing"),
        ("resources: []\nsinks: [{name: s, kind: stdout}]\n", r"resources: List should have at least 1"),
        ("resources: [{resource: pods, namspace: x}]\nsinks: [{name: s, kind: stdout}]\n",
         r"resources\.0\.namspace: unknown field"),
        ("resources: [{resource: pods, label_selector: 'app=('}]\nsinks: [{name: s, kind: stdout}]\n",
         r"resources\.0\.label_selector: unable to parse requirement: found '\(', expected: identifier"),
        ("resources: [{resource: pods, label_selector: 'tier in (web'}]\n"
         "sinks: [{name: s, kind: stdout}]\n",
         r"resources\.0\.label_selector: unable to parse requirement: found '', expected: ',' or '\)'"),
        ("resources: [{resource: pods, field_selector: 'spec.nodname=n1'}]\n"
         "sinks: [{name: s, kind: stdout}]\n",
         r"resources\.0\.field_selector: field label not supported: spec\.nodname"),
        ("resources: [{resource: jobs.batch, field_selector: 'spec.x=1'}]\n"
         "sinks: [{name: s, kind: stdout}]\n",
         r"resources\.0\.field_selector: field label not supported: spec\.x"),
        ("resources: [{resource: pods}]\nsinks: [{name: Bad Name, kind: stdout}]\n",
         r"sinks\.0\.name: sink name 'Bad Name' must be lowercase"),
        ("resources: [{resource: pods}]\nsinks: [{name: a, kind: stdout}, {name: a, kind: file}]\n",
         r"sinks: sink names must be unique; repeated: a"),
        ("resources: [{resource: pods}, {resource: pods}]\nsinks: [{name: s, kind: stdout}]\n",
         r"resources: resources\.0 \('pods'\) and resources\.1 \('pods'\) both name pods in all namespaces"),
        ("resources: [{resource: deploy}, {resource: Deployment}, {resource: deployments.apps}]\n"
         "sinks: [{name: s, kind: stdout}]\n",
         r"resources: resources\.0 \('deploy'\) and resources\.1 \('Deployment'\) both name "
         r"deployments\.apps"),
        ("resources: [{resource: widgets.v1.example.com, namespace: a}, {resource: widgets.example.com/v1, "
         "namespace: a}]\nsinks: [{name: s, kind: stdout}]\n",
         r"resources\.0 \('widgets\.v1\.example\.com'\) and resources\.1 \('widgets\.example\.com/v1'\) both "
         r"name widgets\.example\.com in namespace 'a'"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\ncheckpoint: {store: redis}\n",
         r"checkpoint\.store: Input should be 'file', 'configmap', 'nats-kv' or 'none'"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\ncheckpoint: {interval: 0}\n",
         r"checkpoint\.interval: Input should be greater than 0"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\n"
         "leader_election: {lease_duration: 5, renew_deadline: 10}\n",
         r"leader_election: lease_duration must be greater than renew_deadline"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\nserver: {port: 99999}\n",
         r"server\.port: Input should be less than or equal to 65535"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\nkubernetes: {qps: 0}\n",
         r"kubernetes\.qps: 0 would never send a request"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\nkubernetes: {qps: 5, burst: 0}\n",
         r"kubernetes: burst: must be at least 1 while qps is positive"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\nsharding: {strategy: node}\n",
         r"sharding: node_name: empty and \$NODE_NAME is not set"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\n"
         "sharding: {strategy: node, node_name: n1, shards: 3}\n",
         r"sharding: shards: strategy: node has one replica per node"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\n"
         "sharding: {strategy: node, node_name: n1, unscheduled: true}\n",
         r"sharding: node_name: the replica with unscheduled: true"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\n"
         "sharding: {strategy: node, node_name: 'Node 1'}\n",
         r"sharding: node_name: 'Node 1' is not a node name"),
        ("resources: [{resource: pods}]\nsinks: [{name: s, kind: stdout}]\nsharding: {node_name: n1}\n",
         r"sharding: node_name: only for strategy: node"),
        ("resources: [{resource: po, field_selector: spec.nodeName=x}]\nsinks: [{name: s, kind: stdout}]\n"
         "sharding: {strategy: node, node_name: n1}\n",
         r"resources\.0\.field_selector: strategy: node sets spec\.nodeName itself"),
        ("resources: [{resource: pods, sharding: resource}]\nsinks: [{name: s, kind: stdout}]\n"
         "sharding: {strategy: node, unscheduled: true}\n",
         r"resources\.0\.sharding: strategy: node decides where every resource runs"),
        ("- just\n- a list\n", r"must hold a mapping at the top level, not list"),
        ("resources: [\n", r"is not valid YAML"),
    ],
)
def test_common_mistakes_give_one_clear_message(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        load_config(write(tmp_path, text))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read config file .*nope\.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_a_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    """Found by fuzzing the loader: a Latin-1 or binary file used to end in a UnicodeDecodeError."""
    path = tmp_path / "c.yaml"
    path.write_bytes(b"resources: [{resource: pods, namespace: caf\xe9}]\n")
    with pytest.raises(ConfigurationError, match=r"config file .*c\.yaml is not UTF-8 text \(byte 43: "):
        load_config(path)


def test_a_top_level_key_that_is_not_a_name_is_a_clear_error(tmp_path: Path) -> None:
    """Found by fuzzing the loader: `1: x` at the top level used to end in a TypeError."""
    with pytest.raises(ConfigurationError, match=r"config\.yaml: top-level keys must be names, not 1$"):
        load_config(write(tmp_path, "resources: [{resource: pods}]\n1: x\n"))


@pytest.mark.parametrize(("checkpoint", "events", "delay"), [
    ({}, 1000, 0.2),
    ({"store": "configmap"}, 1000, 1.0),
    ({"store": "configmap", "commit_delay": 0.5}, 1000, 0.5),
    ({"store": "nats-kv", "commit_events": 50}, 50, 0.2),
])
def test_group_commit_defaults_follow_the_store(checkpoint: dict[str, object], events: int,
                                                 delay: float) -> None:
    from bridge.service.config import BridgeConfig

    cfg = BridgeConfig.model_validate({"resources": [{"resource": "pods"}], "checkpoint": checkpoint,
                                       "sinks": [{"name": "out", "kind": "stdout"}]})
    assert (cfg.checkpoint.commit_events, cfg.checkpoint.group_commit_delay) == (events, delay)
    assert cfg.kubernetes.stall_after == 300.0
