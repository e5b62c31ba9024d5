"""The one trace format of both plugins: Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev).

A :class:`TraceLog` collects one process's events with times in seconds from the caller's clock
(``time.monotonic()`` in training, so the ranks of one machine line up) and writes::

    {"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}

Spans are complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds), moments are instant
events (``"ph": "i"``); ``pid`` is the rank, and each *track* (``"training"``, ``"ops"``, ...) gets
as many threads (``tid``) as it has spans at once, so no two spans of one thread overlap, named by
``"M"`` metadata events. ``cat`` says what an event is (``ready``, ``op``, ``wait``, ...), ``args``
carries its fields; ``metadata`` holds what the run was (scheduler, backend, world_size, ...).
"""
from __future__ import annotations

import math

import json
import os
import threading
from typing import Any, Iterator

from byteps_prophet.errors import ConfigError

LANES_PER_TRACK = 1000  # tids of one track: base + lane


class TraceLog:
    """One process's events. ``instant`` and ``span`` may be called from any thread."""

    def __init__(self, pid: int, process: str) -> None:
        self.pid, self.process = pid, process
        self._instants: list[tuple[str, str, float, str, dict]] = []
        self._spans: list[tuple[str, str, float, float, str, dict]] = []
        self._tracks: dict[str, int] = {}
        self._planned_seen = 0
        self._lock = threading.Lock()

    def instant(self, cat: str, name: str, t: float, track: str = "training", **args: Any) -> None:
        with self._lock:
            self._track(track)
            self._instants.append((cat, name, t, track, args))

    def span(self, cat: str, name: str, start: float, end: float, track: str = "ops", **args: Any) -> None:
        with self._lock:
            self._track(track)
            self._spans.append((cat, name, start, max(start, end), track, args))

    def plan(self, scheduler: Any, iteration: int, t: float) -> None:
        """A ``plan`` instant when Prophet's prediction scheduled another iteration since the last call
        (its ``planned_iterations`` grew; other schedulers have none)."""
        planned = getattr(scheduler, "planned_iterations", 0)
        if planned > self._planned_seen:
            self._planned_seen = planned
            self.instant("plan", "Prophet plan", t, iteration=iteration)

    def _track(self, track: str) -> int:
        return self._tracks.setdefault(track, len(self._tracks))

    def __len__(self) -> int:
        return len(self._instants) + len(self._spans)

    def document(self, metadata: dict | None = None) -> dict:
        """The Chrome trace object: metadata events, then instants and spans by time."""
        with self._lock:
            instants, spans, tracks = list(self._instants), list(self._spans), dict(self._tracks)
        pid = self.pid
        events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                               "args": {"name": self.process}}]
        body: list[dict] = []
        lanes: dict[str, list[float]] = {track: [] for track in tracks}  # each lane's last end
        for cat, name, start, end, track, args in sorted(spans, key=lambda s: (s[2], -s[3])):
            ts, end_us = _us(start), _us(end)  # lanes decided on the times as written
            ends = lanes[track]
            lane = next((i for i, last in enumerate(ends) if last <= ts), len(ends))
            if lane == len(ends):
                ends.append(end_us)
            else:
                ends[lane] = end_us
            body.append({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": round(end_us - ts, 3),
                         "pid": pid, "tid": tracks[track] * LANES_PER_TRACK + lane, "args": args})
        for cat, name, t, track, args in instants:
            body.append({"name": name, "cat": cat, "ph": "i", "s": "t", "ts": _us(t), "pid": pid,
                         "tid": tracks[track] * LANES_PER_TRACK, "args": args})
        for track, order in tracks.items():
            for lane in range(max(1, len(lanes[track]))):
                tid = order * LANES_PER_TRACK + lane
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"name": track if lane == 0 else f"{track} {lane}"}})
                events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}})
        body.sort(key=lambda e: e["ts"])
        return {"traceEvents": events + body, "displayTimeUnit": "ms", "metadata": dict(metadata or {})}

    def save(self, path: str, metadata: dict | None = None) -> str:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.document(metadata), f)
        return path


def trace_path(template: str, rank: int, primary: bool) -> str:
    """Where one rank writes ``BYTEPS_PROPHET_TRACE=template``: ``{rank}`` is replaced; without it the
    primary rank (the one that schedules) keeps the path and every other rank writes
    ``<stem>.rank<N>.<ext>`` beside it (one path for every rank, as on a shared disk)."""
    if "{rank}" in template:
        return template.replace("{rank}", str(rank))
    if primary:
        return template
    stem, dot, ext = template.rpartition(".")
    return f"{stem}.rank{rank}.{ext}" if dot and "/" not in ext else f"{template}.rank{rank}"


def writable(path: str, variable: str = "BYTEPS_PROPHET_TRACE") -> str:
    """``path`` if its directory exists, checked when training starts rather than when the file is
    written at its end; ``ConfigError`` (one line, naming ``variable``) if it does not."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(f"{variable}={path!r}: directory {directory!r} does not exist; "
                          f"valid: a file path in an existing directory")
    return path


def load(path: str) -> dict:
    """A trace file as written by :meth:`TraceLog.save`; ``ValueError`` (one line) if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise TypeError("no traceEvents list")
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: not a trace file ({type(err).__name__}: {err})") from None
    doc.setdefault("metadata", {})
    return doc


def events(doc: dict, cat: str) -> Iterator[dict]:
    """The events of one kind (``cat``), in time order."""
    return (e for e in doc["traceEvents"] if e.get("cat") == cat)


def first_ready(doc: dict) -> dict[int, float]:
    """Per iteration, when the worker posted its first gradient (seconds, the clock that stamped it)."""
    firsts: dict[int, float] = {}
    for event in events(doc, "ready"):
        iteration = event["args"]["iteration"]
        firsts[iteration] = min(firsts.get(iteration, math.inf), event["ts"] / 1e6)
    return firsts


def step_skews(leader: dict, other: dict, steps: int) -> list[float]:
    """How far another worker ran behind the leader (negative: ahead) in each of the leader's last
    ``steps`` iterations (the timed ones): its first posted gradient less the leader's, the nearest
    of its iterations paired (two workers' traces on one machine share its monotonic clock)."""
    theirs = sorted(first_ready(other).values())
    mine = first_ready(leader)
    timed = [mine[i] for i in sorted(mine)][-steps:]
    return [round(min(theirs, key=lambda t: abs(t - start)) - start, 4) for start in timed] if theirs else []


def seconds(ts_us: float | None) -> float | None:
    """A trace time (microseconds) in seconds, as the clock that stamped it."""
    return None if ts_us is None else ts_us / 1e6


def _us(t: float) -> float:
    return round(t * 1e6, 3)
