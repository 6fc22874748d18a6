"""The application object gunicorn loads in each worker (after the fork):
its configuration comes from $COMET_CONFIG and the COMET_* environment."""

from __future__ import annotations

import os

from .app import create_app
from .config import load

app = create_app(load(), access_log=os.environ.get("COMET_ACCESS_LOG", "1") != "0")
