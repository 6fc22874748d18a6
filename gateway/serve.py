"""`comet serve`: the gateway on gunicorn with uvicorn workers.

Options given on the command line are exported as COMET_* variables, so that
the gunicorn master (which reads gateway/gunicorn.conf.py) and every worker
(which builds the app from the environment) see one configuration.  The
process then becomes gunicorn (exec), so signals reach the master directly:
HUP reloads the workers gracefully, TERM drains and stops.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from .config import load

CONF = Path(__file__).with_name("gunicorn.conf.py")


def gunicorn_argv() -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", str(CONF), "gateway.wsgi:app"]


def prepare_env(config_file: str | None, overrides: Mapping[str, object]) -> dict[str, str]:
    env = dict(os.environ)
    if config_file:
        env["COMET_CONFIG"] = str(Path(config_file).resolve())
    for key, value in overrides.items():
        if value is not None:
            env[f"COMET_{key.upper()}"] = str(value)
    if "COMET_DATA_DIR" in env:
        env["COMET_DATA_DIR"] = str(Path(env["COMET_DATA_DIR"]).resolve())
    load(env=env)  # fail here, with a clear message, rather than in every worker
    return env


def exec_gunicorn(config_file: str | None, overrides: Mapping[str, object]) -> None:
    env = prepare_env(config_file, overrides)
    os.execvpe(sys.executable, gunicorn_argv(), env)
