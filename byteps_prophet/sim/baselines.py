"""What a PyTorch user runs instead of a scheduler: DDP's gradient buckets and Horovod's tensor fusion.

Both fuse whole gradients into one collective and never cut or reorder them, so they are baselines,
not schedules. Neither updates a layer before the whole step is synchronised: DDP's ``backward()``
returns when every bucket is all-reduced, Horovod's ``step()`` first waits for every gradient, and
only then does the optimizer run and the next forward start. So by default (``barrier=True``) every
gradient of an iteration is reported done together, once the backward is over and the last
collective of the iteration is done; ``barrier=False`` reports each as its collective completes (a
DDP that let the next forward start layer by layer, which torch does not).

The simulator drives them with the same three events as the schedulers of ``scheduler.py``
(``post``, ``finished``, ``end_of_backward``; ``tick`` for a timer asked for with ``on_wakeup``) and they answer the same way (``transport.send``, ``on_done``). They are written
against that contract only, not the ``Scheduler`` base class: what they send is a
:class:`Collective` of several gradients, which the transport carries as one message (it reads
``nbytes`` and reports the collective back through ``finished``); on completion every gradient in it
is reported done, exactly once.

* :class:`DDPBuckets` (``torch.nn.parallel.DistributedDataParallel``): gradients fill buckets in the
  order they become ready (backward order: DDP rebuilds its buckets after the first iteration in the
  order the gradients arrived); a bucket is all-reduced as soon as it holds ``bucket_bytes`` or more
  (a gradient never straddles two buckets, so a bucket may pass the cap by one gradient); the first
  bucket of an iteration is capped at ``first_bucket_bytes`` (DDP's 1 MiB), the last, partial one is
  sent at the end of backward. Defaults are DDP's: 25 MiB, first 1 MiB.
* :class:`HorovodFusion`: a background loop wakes every ``cycle_time``; each cycle takes every ready
  gradient in ready order and fuses runs of them up to ``fusion_bytes`` into one collective (a
  gradient larger than the buffer goes alone), and the loop waits until that cycle's collectives are
  done before the next cycle (Horovod's CPU operations run on the loop's thread). Defaults are
  Horovod's since 0.21: 1 ms, 128 MiB. Negotiation among workers is taken as free.

Pure Python: no framework imports, no threads; time from the injected clock.
"""
from __future__ import annotations

import math
from typing import Callable

from byteps_prophet.core.clock import Clock
from byteps_prophet.core.task import State, Task

MIB = 1 << 20
DDP_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
HOROVOD_CYCLE_S = 1e-3  # HOROVOD_CYCLE_TIME, 1 ms since Horovod 0.21 (5 ms before)
HOROVOD_FUSION_BYTES = 128 * MIB  # HOROVOD_FUSION_THRESHOLD, 128 MiB since 0.21 (64 MiB before)


class Collective:
    """Several whole gradients synchronised as one message (a DDP bucket, a Horovod fusion)."""

    __slots__ = ("members", "nbytes", "index", "iteration", "key", "start_time", "finish_time", "state")

    def __init__(self, members: list[Task], key: str) -> None:
        if not members:
            raise ValueError("a collective of no gradients")
        self.members = members
        self.nbytes = sum(task.nbytes for task in members)
        self.index = min(task.index for task in members)
        self.iteration = members[0].iteration
        self.key = key
        self.start_time = self.finish_time = math.nan
        self.state = State.READY

    @property
    def rows(self) -> int:
        return sum(task.rows for task in self.members)

    def __repr__(self) -> str:
        return f"Collective({self.key}, {len(self.members)} gradients, {self.nbytes}B, {self.state.value})"


class _Fusing:
    """The shared part: whole gradients in, collectives out, every gradient done exactly once."""

    name = "fusing"

    def __init__(self, clock: Clock, transport, on_done: Callable[[Task], None] | None = None,
                 barrier: bool = True) -> None:
        self.clock = clock
        self.barrier = barrier
        self._pending: dict[int, int] = {}  # iteration -> gradients posted and not yet synchronised
        self._held: dict[int, list[Task]] = {}  # iteration -> synchronised, not yet reported (barrier)
        self._backward_over: set[int] = set()
        self.transport = transport
        self.on_done = on_done or (lambda task: None)
        self.on_wakeup: Callable[[float], None] | None = None
        self.in_flight: set[Collective] = set()
        self.in_flight_bytes = 0
        self.collectives_sent = 0
        self.bytes_sent = 0
        self._count = 0

    # -- events -------------------------------------------------------------------------------------
    def post(self, task: Task) -> None:
        if task.parent is not None or task.state is not State.POSTED:
            raise ValueError(f"post() takes a whole gradient once, got {task!r}")
        task.state = State.READY
        task.ready_time = self.clock.now()
        self._pending[task.iteration] = self._pending.get(task.iteration, 0) + 1
        self._on_ready(task)

    def finished(self, collective: Collective) -> None:
        if collective not in self.in_flight:
            raise ValueError(f"finished() for a collective that is not in flight: {collective!r}")
        now = self.clock.now()
        self.in_flight.discard(collective)
        self.in_flight_bytes -= collective.nbytes
        collective.state = State.FINISHED
        collective.finish_time = now
        for task in collective.members:
            if task.state is not State.STARTED:
                raise RuntimeError(f"{task.name}: synchronised twice in iteration {task.iteration}")
            task.state = State.FINISHED
            task.rows_done = task.shape[0]
            task.finish_time = now
            self._pending[task.iteration] -= 1
            if self.barrier:
                self._held.setdefault(task.iteration, []).append(task)
            else:
                self.on_done(task)
        for iteration in {task.iteration for task in collective.members}:
            self._release(iteration)
        self._on_finished(collective)

    def end_of_backward(self, iteration: int) -> None:
        self._backward_over.add(iteration)
        self._on_end_of_backward(iteration)
        self._release(iteration)

    def _release(self, iteration: int) -> None:
        """The step's barrier: report an iteration's gradients once its backward is over and all are synchronised."""
        if iteration not in self._backward_over or self._pending.get(iteration, 0):
            return
        self._backward_over.discard(iteration)
        self._pending.pop(iteration, None)
        for task in self._held.pop(iteration, []):
            self.on_done(task)

    def tick(self) -> None:
        self._on_tick()

    # -- what subclasses change ---------------------------------------------------------------------
    def _on_ready(self, task: Task) -> None:
        raise NotImplementedError

    def _on_finished(self, collective: Collective) -> None:
        pass

    def _on_end_of_backward(self, iteration: int) -> None:
        pass

    def _on_tick(self) -> None:
        pass

    # -- shared machinery ---------------------------------------------------------------------------
    def _send(self, members: list[Task]) -> None:
        now = self.clock.now()
        collective = Collective(members, f"{self.name}{self._count}.it{members[0].iteration}")
        self._count += 1
        for task in members:
            if task.state is not State.READY:
                raise RuntimeError(f"{task.name}: sent twice in iteration {task.iteration}")
            task.state = State.STARTED
            task.start_time = now
        collective.state = State.STARTED
        collective.start_time = now
        self.in_flight.add(collective)
        self.in_flight_bytes += collective.nbytes
        self.collectives_sent += 1
        self.bytes_sent += collective.nbytes
        self.transport.send(collective)  # may call finished() before it returns


class DDPBuckets(_Fusing):
    """DistributedDataParallel's gradient buckets (module docstring)."""

    name = "ddp"

    def __init__(self, clock: Clock, transport, on_done: Callable[[Task], None] | None = None,
                 bucket_bytes: int = DDP_BUCKET_BYTES, first_bucket_bytes: int | None = DDP_FIRST_BUCKET_BYTES,
                 barrier: bool = True) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes!r} is invalid; valid: an integer >= 1")
        super().__init__(clock, transport, on_done, barrier)
        self.bucket_bytes = int(bucket_bytes)
        # DDP caps the first bucket lower so that communication starts early; never above the cap.
        self.first_bucket_bytes = min(self.bucket_bytes, int(first_bucket_bytes or self.bucket_bytes))
        self._bucket: list[Task] = []
        self._bucket_fill = 0
        self._buckets_this_iteration = 0

    def _cap(self) -> int:
        return self.first_bucket_bytes if self._buckets_this_iteration == 0 else self.bucket_bytes

    def _on_ready(self, task: Task) -> None:
        if self._bucket and task.iteration != self._bucket[0].iteration:
            self._flush()  # a new iteration without end_of_backward for the last: never mix iterations
        self._bucket.append(task)
        self._bucket_fill += task.nbytes
        if self._bucket_fill >= self._cap():
            self._flush()

    def _on_end_of_backward(self, iteration: int) -> None:
        self._flush()
        self._buckets_this_iteration = 0

    def _flush(self) -> None:
        if not self._bucket:
            return
        members, self._bucket, self._bucket_fill = self._bucket, [], 0
        self._buckets_this_iteration += 1
        self._send(members)


class HorovodFusion(_Fusing):
    """Horovod's tensor fusion on a background cycle (module docstring)."""

    name = "horovod"

    def __init__(self, clock: Clock, transport, on_done: Callable[[Task], None] | None = None,
                 cycle_s: float = HOROVOD_CYCLE_S, fusion_bytes: int = HOROVOD_FUSION_BYTES,
                 barrier: bool = True) -> None:
        if not cycle_s > 0:
            raise ValueError(f"cycle_s={cycle_s!r} is invalid; valid: a number of seconds > 0")
        if fusion_bytes < 0:
            raise ValueError(f"fusion_bytes={fusion_bytes!r} is invalid; valid: an integer >= 0 (0: no fusion)")
        super().__init__(clock, transport, on_done, barrier)
        self.cycle_s = float(cycle_s)
        self.fusion_bytes = int(fusion_bytes)
        self._ready: list[Task] = []
        self._origin = 0.0  # the idle loop wakes at _origin + k * cycle_s
        self._busy = False  # this cycle's collectives are not all done yet
        self._sending = False
        self._cycle_started = -math.inf
        self._next: float | None = None  # the cycle a timer was asked for

    def _on_ready(self, task: Task) -> None:
        self._ready.append(task)
        self._plan()

    def _on_finished(self, collective: Collective) -> None:
        if not self.in_flight and not self._sending:
            self._cycle_done()

    def _cycle_done(self) -> None:
        self._busy = False
        # the loop sleeps out the rest of the cycle, then keeps its beat from there
        self._origin = max(self.clock.now(), self._cycle_started + self.cycle_s)
        self._plan()

    def _on_tick(self) -> None:
        now = self.clock.now()
        if self._next is None or now < self._next or self._busy:
            return
        self._next = None
        self._cycle(now)

    def _plan(self) -> None:
        """Ask for the next cycle at which the loop will find the ready gradients."""
        if self._busy or not self._ready or self._next is not None:
            return
        now = self.clock.now()
        if now <= self._origin:
            when = self._origin
        else:
            when = self._origin + math.ceil((now - self._origin) / self.cycle_s - 1e-9) * self.cycle_s
        if self.on_wakeup is None or when <= now:
            self._cycle(now)  # no timer to wait for: the cycle runs now
            return
        self._next = when
        self.on_wakeup(when)

    def _cycle(self, now: float) -> None:
        if not self._ready:
            self._origin = now
            return
        self._busy = True
        self._cycle_started = now
        ready, self._ready = self._ready, []
        groups: list[list[Task]] = []
        fill = 0
        for task in ready:
            if groups and fill + task.nbytes <= self.fusion_bytes:
                groups[-1].append(task)
                fill += task.nbytes
            else:
                groups.append([task])
                fill = task.nbytes
        self._sending = True
        try:
            for group in groups:
                self._send(group)  # the ring carries them one after another
        finally:
            self._sending = False
        if not self.in_flight:  # a transport that finished them all before returning
            self._cycle_done()
