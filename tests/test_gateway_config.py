"""Gateway configuration: TOML file, COMET_* environment, clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gateway.config import ConfigError, GatewayConfig, load


def test_file_then_environment(tmp_path: Path) -> None:
    toml = tmp_path / "comet.toml"
    toml.write_text('''
data_dir = "/srv/comet"
host = "0.0.0.0"
port = 9000
workers = 3
tokens = ["alpha-secret", "bravo-secret"]
validate = true

[storage]
shards = 8
durability = "always"
retention_max_total_bytes = 1073741824

[streams.metrics]
validate = false
''')
    cfg = load(toml, env={"COMET_PORT": "9100", "COMET_STORAGE_SHARDS": "4", "COMET_TOKENS": "x-secret, y-secret"})
    assert (cfg.data_dir, cfg.host, cfg.port, cfg.workers) == ("/srv/comet", "0.0.0.0", 9100, 3)
    assert cfg.tokens == ("x-secret", "y-secret") and cfg.auth_required
    assert cfg.storage.shards == 4 and cfg.storage.durability == "always"
    assert cfg.storage.retention_max_total_bytes == 1 << 30
    assert cfg.validates("events") and not cfg.validates("metrics")
    storage = cfg.storage_config()
    assert storage.process_count == 3 and storage.max_streams == cfg.max_streams
    assert not storage.auto_create_streams  # the gateway opens streams itself (may_create)
    assert cfg.may_create("anything")


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('port = 7000\n')
    assert load(env={"COMET_CONFIG": str(tmp_path / "c.toml")}).port == 7000
    assert load(env={}) == GatewayConfig()


@pytest.mark.parametrize("text, message", [
    ('colour = "red"\n', "unknown setting 'colour'"),
    ('[storage]\nsize = 1\n', "unknown storage setting 'size'"),
    ('port = "eighty"\n', "cannot use 'eighty' as int"),
    ('auth = "maybe"\n', "auth must be"),
    ('auth = "on"\n', "no tokens"),
    ('port = \n', "comet.toml"),
    ('[storage]\ndurability = "sometimes"\n', "durability must be"),
])
def test_bad_settings_are_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "comet.toml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load(tmp_path / "comet.toml", env={})


def test_bad_environment_values() -> None:
    with pytest.raises(ConfigError, match="COMET_WORKERS"):
        load(env={"COMET_WORKERS": "many"})
    with pytest.raises(ConfigError, match="COMET_VALIDATE"):
        load(env={"COMET_VALIDATE": "perhaps"})
    with pytest.raises(ConfigError, match="does not exist"):
        load("/nonexistent/comet.toml", env={})


@pytest.mark.parametrize("key, instead", [("max_streams", "max_streams (COMET_MAX_STREAMS)"),
                                          ("process_count", "workers (COMET_WORKERS)"),
                                          ("auto_create_streams", "auto_create (COMET_AUTO_CREATE)")])
def test_a_storage_key_the_gateway_sets_is_refused_naming_the_setting_to_use(
        tmp_path: Path, key: str, instead: str) -> None:
    """A [storage] key the gateway sets from its own setting would be ignored: refused in the
    file and in the environment, in one line naming the setting to use instead."""
    value = "true" if key == "auto_create_streams" else "5"
    (tmp_path / "comet.toml").write_text(f"[storage]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as refused:
        load(tmp_path / "comet.toml", env={})
    assert str(refused.value) == (f"storage.{key} in {tmp_path / 'comet.toml'}: the gateway sets "
                                  f"{key} itself; use {instead} instead")
    var = f"COMET_STORAGE_{key.upper()}"
    with pytest.raises(ConfigError) as refused:
        load(env={var: value})
    assert str(refused.value) == f"{var}: the gateway sets {key} itself; use {instead} instead"
    assert "\n" not in str(refused.value)


def test_serve_refuses_a_bad_config_before_starting(tmp_path: Path) -> None:
    import subprocess
    import sys

    comet = Path(sys.executable).with_name("comet")
    (tmp_path / "bad.toml").write_text('workers = -2\n')
    out = subprocess.run([str(comet), "serve", "--config", str(tmp_path / "bad.toml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "workers must be >= 0" in out.stderr


def test_non_loopback_bind_without_tokens_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="not loopback, so tokens are required"):
        load(None, env={"COMET_HOST": "0.0.0.0"})
    assert not load(None, env={"COMET_HOST": "0.0.0.0", "COMET_AUTH": "off"}).auth_required
    assert load(None, env={"COMET_HOST": "0.0.0.0", "COMET_TOKENS": "t0ken-t0ken"}).auth_required


@pytest.mark.parametrize("text, message", [
    ('[storage]\ndurability = "sometimes"\n', "durability must be"),
    ('[streams.metrics]\nvalidat = false\n', "unknown setting 'validat' in \\[streams.metrics\\]"),
    ('[streams.metrics]\nvalidate = "maybe"\n', "streams.metrics.validate: cannot use 'maybe'"),
    ("streams = 3\n", "must be a table"),
    ("storage = 3\n", "must be a table"),
])
def test_bad_settings_are_config_errors(tmp_path: Path, text: str, message: str) -> None:
    toml = tmp_path / "comet.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(toml, env={})


def test_stream_policy_strings_are_parsed(tmp_path: Path) -> None:
    toml = tmp_path / "comet.toml"
    toml.write_text('[streams.metrics]\nvalidate = "false"\n')
    assert not load(toml, env={}).validates("metrics")


def test_storage_limits_of_the_c_core_fail_at_load() -> None:
    with pytest.raises(ConfigError, match="room for two segments"):
        load(None, env={"COMET_STORAGE_SEGMENT_BYTES": str(1 << 20),
                        "COMET_STORAGE_RETENTION_MAX_TOTAL_BYTES": str(1 << 20)})


def test_default_workers_follow_cpu_affinity() -> None:
    import os

    assert GatewayConfig().worker_count == len(os.sched_getaffinity(0))
    assert GatewayConfig(workers=3).worker_count == 3


# ---- tokens -----------------------------------------------------------------------------

SHA = hashlib.sha256(b"s3cret").hexdigest()


def test_tokens_by_secret_by_hash_and_from_a_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[tokens]]\nname = "edge"\nsha256 = "{SHA.upper()}"\nwrite = ["logs-*"]\n'
                      '\n[[tokens]]\nname = "ops"\ntoken = "ops-secret"\nadmin = true\n')
    toml = tmp_path / "comet.toml"
    toml.write_text(f'auth = "on"\ntokens = ["alpha-secret", "bravo-secret"]\ntokens_file = "{tokens}"\n')
    access = load(toml, env={}).access
    by_name = {t.name: t for t in access.tokens}
    assert list(by_name) == ["token-1", "token-2", "edge", "ops"]
    assert by_name["token-1"].write == by_name["token-1"].read == ("*",) and by_name["token-2"].admin
    assert (by_name["edge"].write, by_name["edge"].read, by_name["edge"].admin) == (("logs-*",), (), False)
    assert access.identify(b"s3cret") is by_name["edge"] and access.identify(b"ops-secret") is by_name["ops"]
    assert access.identify(b"bravo-secret") is by_name["token-2"] and access.identify(b"nope") is None
    assert access.allows(by_name["edge"], "write", "logs-1")
    assert not access.allows(by_name["edge"], "write", "metrics")
    assert not access.allows(by_name["edge"], "read", "logs-1")
    # the environment's plain list replaces the file's; the tokens_file's still count
    names = [t.name for t in load(toml, env={"COMET_TOKENS": "x-secret,y-secret,z-secret"}).access.tokens]
    assert names == ["token-1", "token-2", "token-3", "edge", "ops"]
    shown = repr(load(toml, env={}))
    assert "alpha-secret" not in shown and "ops-secret" not in shown and "digest" not in shown


def table(**keys: object) -> str:
    return "[[tokens]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


@pytest.mark.parametrize("text, message", [
    (table(name="a", token="x", colour="red"), "token 'a' in .*: unknown key 'colour'"),
    (table(token="x"), "token 1 in .* needs a name"),
    (table(name="", token="x"), "token 1 in .* needs a name"),
    (table(name="x" * 65, token="x"), "token 1 in .* needs a name: 1 to 64 printable"),
    (table(name="a", token="x") + table(name="a", token="y"), "token name 'a' is used twice"),
    ('tokens = ["x"]\n[[more]]\n', "unknown setting 'more'"),
    ('tokens = ["x", {name = "token-1", token = "y"}]\n', "token name 'token-1' is used twice"),
    (table(name="a", token="x") + table(name="b", sha256=hashlib.sha256(b"x").hexdigest()),
     "tokens 'a' and 'b' have the same secret"),
    (table(name="a"), "token 'a' in .*: give exactly one of token .* and sha256"),
    (table(name="a", token="x", sha256=SHA), "token 'a' in .*: give exactly one of token"),
    (table(name="a", sha256=SHA[:-1]), "token 'a' in .*: sha256 must be 64 hexadecimal digits"),
    (table(name="a", sha256=SHA[:-1] + "g"), "token 'a' in .*: sha256 must be 64 hexadecimal"),
    (table(name="a", sha256=7), "token 'a' in .*: sha256 must be 64 hexadecimal"),
    (table(name="a", token=""), "token 'a' in .*: token must be a non-empty string"),
    (table(name="a", token="x", write=["logs-*", ""]), "token 'a' in .*: write must be a list of "
                                                       "stream name patterns"),
    (table(name="a", token="x", read="logs-*"), "token 'a' in .*: read must be a list"),
    (table(name="a", token="x", read=[3]), "token 'a' in .*: read must be a list"),
    (table(name="a", token="x", admin="yes"), "token 'a' in .*: admin must be true or false"),
    ('tokens = [""]\n', "token 1 in .* is an empty string"),
    ('tokens = [3]\n', "token 1 in .* must be a string or a table"),
    ('tokens = "s3cret"\n', "tokens in .* must be a list"),
])
@pytest.mark.parametrize("where", ["config", "tokens_file"])
def test_bad_tokens_are_named(tmp_path: Path, text: str, message: str, where: str) -> None:
    toml, tokens = tmp_path / "comet.toml", tmp_path / "tokens.toml"
    if where == "config":
        toml.write_text(text)
    else:
        toml.write_text(f'tokens_file = "{tokens}"\n')
        tokens.write_text(text)
        if "unknown setting" in message:
            message += " in tokens_file"
    with pytest.raises(ConfigError, match=message):
        load(toml, env={})


def test_a_tokens_file_that_is_missing_or_broken_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokens_file /nonexistent.toml does not exist"):
        load(None, env={"COMET_TOKENS_FILE": "/nonexistent.toml"})
    (tmp_path / "t.toml").write_text("[[tokens]\n")
    with pytest.raises(ConfigError, match=f"tokens_file {tmp_path}/t.toml: "):
        load(None, env={"COMET_TOKENS_FILE": str(tmp_path / "t.toml")})
    (tmp_path / "t.toml").write_text("data_dir = '/tmp'\n")
    with pytest.raises(ConfigError, match="unknown setting 'data_dir' in tokens_file"):
        load(None, env={"COMET_TOKENS_FILE": str(tmp_path / "t.toml")})


def test_a_tokens_file_alone_satisfies_auth_on(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text(table(name="a", token="x-secret", read=["*"]))
    cfg = load(None, env={"COMET_AUTH": "on", "COMET_TOKENS_FILE": str(tmp_path / "t.toml")})
    assert [t.name for t in cfg.access.tokens] == ["a"]
    (tmp_path / "t.toml").write_text("")
    with pytest.raises(ConfigError, match="auth is on but no tokens are configured"):
        load(None, env={"COMET_AUTH": "on", "COMET_TOKENS_FILE": str(tmp_path / "t.toml")})
