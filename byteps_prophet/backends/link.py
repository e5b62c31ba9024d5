"""Which monitor measures a real backend's link (the core's ``LinkMonitor`` unless told otherwise)."""
from __future__ import annotations

from byteps_prophet.core.link import LinkMonitor
from byteps_prophet.core.settings import Settings


def link_monitor(settings: Settings, stages: int) -> LinkMonitor | None:
    """A :class:`LinkMonitor` for a real backend's scheduler, or None (the core's monitor, each
    completion an exact sample, as in the ideal simulator) with ``BYTEPS_PROPHET_LINK=core``."""
    return LinkMonitor(serializations=stages) if settings.link_monitor == "measured" else None
