"""Which monitor measures a real backend's link (the core's ``LinkMonitor`` unless told otherwise)."""
from __future__ import annotations

import os

from byteps_prophet.core.link import LinkMonitor
from byteps_prophet.errors import ConfigError


def link_monitor(stages: int, environ=None) -> LinkMonitor | None:
    """A :class:`LinkMonitor` for a real backend's scheduler, or None (the core's monitor, each
    completion an exact sample, as in the ideal simulator) when ``BYTEPS_PROPHET_LINK=core``."""
    env = os.environ if environ is None else environ
    mode = env.get("BYTEPS_PROPHET_LINK", "measured").strip().lower() or "measured"
    if mode not in ("measured", "core"):
        raise ConfigError(f"BYTEPS_PROPHET_LINK={mode!r} is invalid; valid: measured, core")
    return LinkMonitor(serializations=stages) if mode == "measured" else None
