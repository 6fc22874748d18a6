"""`comet serve`: the gateway on gunicorn with uvicorn workers.

The command reads the configuration (the file, then COMET_* variables, then
the command line's options, which win) and runs gunicorn in this process
(gateway.serving.server.GatewayServer), so signals reach the master directly: HUP
reloads the configuration and the workers gracefully, TERM drains and stops.
It first checks that the installed uvicorn, gunicorn and uvicorn-worker are
versions the gateway is tested with (gateway.serving.versions), then the
configuration, then what the master checks before it forks
(gateway.startup: the data directory, that no other gateway serves it, the
port), and stops with one line at the first that fails, exit status 1,
before any worker starts.

``serve`` is this package's ``comet`` command, found by ``comet`` through the
``comet.commands`` entry points (pyproject.toml).  This module imports no
web framework until the command runs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Mapping

import click

from .serving import versions
from .config import ConfigError, GatewayConfig, load


def config_reader(config_file: str | None,
                  overrides: Mapping[str, object]) -> Callable[[], GatewayConfig]:
    """What reads the configuration now and at every reload: ``config_file``
    (else $COMET_CONFIG), the environment, then ``overrides`` (options given
    on the command line).  The data directory is made absolute."""
    path = str(Path(config_file).resolve()) if config_file else None

    def read() -> GatewayConfig:
        env = dict(os.environ)
        env.update({f"COMET_{key.upper()}": str(value) for key, value in overrides.items()
                    if value is not None})
        config = load(path, env=env)
        return dataclasses.replace(config, data_dir=str(Path(config.data_dir).resolve()))

    return read


@click.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), envvar="COMET_CONFIG",
              help="TOML configuration file.")
@click.option("--data-dir", help="Data directory (default ./data).")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (default 8080).")
@click.option("--workers", type=int, help="Worker processes (default: one per CPU).")
def serve(config_file: str | None, data_dir: str | None, host: str | None, port: int | None,
          workers: int | None) -> None:
    """Runs the HTTP ingest gateway (gunicorn + uvicorn workers).

    HUP reloads the workers gracefully; TERM, INT (Ctrl-C) and QUIT drain and stop."""
    unsupported = versions.check()
    if unsupported is not None:
        raise click.ClickException(unsupported)
    read = config_reader(config_file, {"data_dir": data_dir, "host": host, "port": port,
                                       "workers": workers})
    from .serving.server import GatewayServer  # the web stack, only for this command
    from .startup import StartError
    try:
        GatewayServer(read).run()
    except (ConfigError, StartError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C before the master took the signal over: nothing runs yet
        raise SystemExit(130) from None
