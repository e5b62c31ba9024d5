"""The framework-free scheduling core: tasks, schedulers, profiler, bandwidth monitor, settings."""
from byteps_prophet.core.bytescheduler import ByteScheduler
from byteps_prophet.core.clock import Clock, ManualClock, MonotonicClock
from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.core.prophet import Prophet
from byteps_prophet.core.scheduler import FIFOScheduler, Scheduler, Transport
from byteps_prophet.core.settings import SCHEDULERS, Settings
from byteps_prophet.core.task import State, Task

SCHEDULER_CLASSES = {"fifo": FIFOScheduler, "bytescheduler": ByteScheduler, "prophet": Prophet}


def make_scheduler(settings: Settings, clock: Clock, transport: Transport, on_done=None, monitor=None) -> Scheduler:
    """The scheduler ``settings.scheduler`` names, for ``transport`` (whose ``traits`` it reads)."""
    return SCHEDULER_CLASSES[settings.scheduler](settings, clock, transport, on_done, monitor)


__all__ = [
    "ByteScheduler", "Clock", "EngineTraits", "FIFOScheduler", "ManualClock", "MonotonicClock", "Prophet",
    "SCHEDULERS", "SCHEDULER_CLASSES", "Scheduler", "Settings", "State", "Task", "Transport", "make_scheduler",
]
