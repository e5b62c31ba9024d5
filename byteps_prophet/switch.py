"""``BYTEPS_SCHEDULER`` as BytePS's patched plugins read it at import (patch 90, ``byteps.torch``;
patch 91, ``byteps.mxnet``).

Each plugin reads nothing else for ``fifo`` (or unset) and does not need this package then; for any
other value it calls :func:`scheduler_from_env`, which validates the value and the scheduler's knobs
(``BYTESCHEDULER_*``, ``PROPHET_*``) through :class:`~byteps_prophet.core.settings.Settings`. Framework-free.
"""
from __future__ import annotations

import sys
from typing import Mapping

from byteps_prophet.core.settings import Settings
from byteps_prophet.errors import ConfigError


def scheduler_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The selected scheduler (``fifo``, ``bytescheduler`` or ``prophet``); when the value or a knob
    is invalid, one line on stderr ("byteps: BYTEPS_SCHEDULER='x' is not a scheduler; valid: ...")
    and exit status 2, before any BytePS work starts."""
    try:
        return Settings.from_env(environ).scheduler
    except ConfigError as err:
        sys.stderr.write(f"byteps: {err}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
