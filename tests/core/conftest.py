import pytest

from byteps_prophet.core import EngineTraits, ManualClock, Settings, Task, make_scheduler


class RecordingTransport:
    """An in-memory backend: remembers what was started; the test decides when it finishes."""

    def __init__(self, stages: int = 2) -> None:
        self.traits = EngineTraits(stages=stages)
        self.sent: list[Task] = []
        self.in_flight: list[Task] = []

    def send(self, task: Task) -> None:
        self.sent.append(task)
        self.in_flight.append(task)


class Harness:
    def __init__(self, **settings) -> None:
        self.clock = ManualClock()
        self.transport = RecordingTransport()
        self.done: list[Task] = []
        self.scheduler = make_scheduler(Settings(**settings), self.clock, self.transport, self.done.append)

    def post(self, name, index, shape, iteration=0):
        task = Task(name, index, shape, iteration=iteration)
        self.scheduler.post(task)
        return task

    def finish(self, piece=None, after=0.0):
        self.clock.advance(after)
        piece = piece or self.transport.in_flight[0]
        self.transport.in_flight.remove(piece)
        self.scheduler.finished(piece)
        return piece


@pytest.fixture
def harness():
    return Harness
