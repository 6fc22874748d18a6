"""Gateway configuration: TOML file, COMET_* environment, clear errors."""

from __future__ import annotations

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
tokens = ["a", "b"]
validate = true

[storage]
shards = 8
durability = "always"
retention_max_total_bytes = 1073741824

[streams.metrics]
validate = false
''')
    cfg = load(toml, env={"COMET_PORT": "9100", "COMET_STORAGE_SHARDS": "4", "COMET_TOKENS": "x, y"})
    assert (cfg.data_dir, cfg.host, cfg.port, cfg.workers) == ("/srv/comet", "0.0.0.0", 9100, 3)
    assert cfg.tokens == ("x", "y") and cfg.auth_required
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
    assert load(None, env={"COMET_HOST": "0.0.0.0", "COMET_TOKENS": "t"}).auth_required


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
