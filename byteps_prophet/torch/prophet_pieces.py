"""What Prophet queues in the torch plugin: its pieces' size and, on a backend that needs stable
slices, its atoms' (docs/DESIGN.md, "ByteScheduler's partition for Prophet's queue on BytePS" and
"Fixed atoms")."""
from __future__ import annotations

from byteps_prophet.core.settings import DEFAULT_PARTITION, Settings

PROPHET_PARTITION = 4_000_000  # elements: Prophet's pieces in the queue on all-reduce; its own cuts size what is sent


def prophet_settings(settings: Settings, pulls_follow_pushes: bool = False) -> Settings:
    """``settings`` with the partition Prophet queues: ``Settings.prophet_partition`` elements
    (``BYTEPS_PROPHET_PARTITION``; 0 keeps ByteScheduler's partition, ``Settings.partition``). Prophet
    cuts pieces to its predictions itself, and ByteScheduler's 1 M-element partition only adds
    messages, each paying a start-up latency. Unset (-1), it is derived from the engine alone: 4 M
    elements on all-reduce; 0 where pulls follow pushes (BytePS), since every chunk there is at most
    2 MiB anyway and a step the link keeps up with goes under ByteScheduler's credit, where 4 M pieces
    would keep one piece in flight. A partition set for ByteScheduler does not change it."""
    if settings.scheduler != "prophet":
        return settings
    value = settings.prophet_partition
    if value < 0:  # unset: derived from the engine
        value = 0 if pulls_follow_pushes else PROPHET_PARTITION
    return settings.replace(partition=value) if value else settings


def prophet_atom_elements(settings: Settings) -> int:
    """Elements per fixed atom where the backend needs stable slices (``Backend.use_atoms``):
    ``BYTEPS_PROPHET_ATOM_ELEMENTS``, default a quarter of ByteScheduler's default partition (250 k,
    as the MXNet stores' atoms, docs/MXNET.md). On a parameter server a piece's pull follows its push,
    so the step ends a few pieces' pushes and pulls after the last byte is ready: finer atoms shorten
    that tail."""
    return settings.atom_elements or DEFAULT_PARTITION // 4
