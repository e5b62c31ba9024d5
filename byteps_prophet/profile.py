"""Recorded profiles: what the timing probe measured in real training, replayable by the simulator.

A profile is a JSON file (format described in ``docs/PROFILE.md``): the model's parameter tensors in
forward order and, per recorded iteration, when each gradient became ready (seconds after the
backward pass started), plus forward times, iteration time and bandwidth where known.

* :class:`ProfileRecorder` is what plugins call from their hooks; it has no clock of its own, every
  time is passed in.
* :func:`load_profile` reads and strictly validates a file; :meth:`Profile.save` writes one.
* The simulator replays one through ``sim/recorded.py`` (``model_and_times``, ``iteration_times``);
  this module imports nothing of the simulator.

Pure Python: no framework import, no threads, no clock.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from byteps_prophet.core.task import TensorSize
from byteps_prophet.errors import UserError

FORMAT = "byteps-prophet-profile"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
FRAMEWORKS = ("pytorch", "mxnet", "tensorflow", "sim")
DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

_TOP_REQUIRED = ("format", "version", "model", "framework", "batch", "device", "world_size", "tensors",
                 "iterations")
_TOP_OPTIONAL = ("meta",)
_TENSOR_REQUIRED = ("index", "name", "shape", "dtype")
_TENSOR_OPTIONAL = ("itemsize",)
_ITER_REQUIRED = ("ready_s",)
_ITER_OPTIONAL = ("fwd_s", "iteration_s", "bandwidth_Bps")
_REL_TOL = 1e-9  # slack when comparing measured times against each other


@dataclass(frozen=True)
class ProfileTensor(TensorSize):
    """One parameter tensor as the probe saw it; its forward index is its position in the profile."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class IterationRecord:
    """One recorded iteration. Per-tensor lists are in forward order; ``None`` = not observed."""

    ready_s: tuple[float | None, ...]  # gradient ready time, seconds after backward start
    fwd_s: tuple[float | None, ...] | None = None  # forward time of each tensor's layer, seconds
    iteration_s: float | None = None  # whole iteration, seconds
    bandwidth_Bps: float | None = None  # measured bandwidth, bytes per second


@dataclass(frozen=True)
class Profile:
    model: str
    framework: str
    batch: int
    device: str
    world_size: int
    tensors: tuple[ProfileTensor, ...]
    iterations: tuple[IterationRecord, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        iterations = []
        for it in self.iterations:
            rec: dict[str, Any] = {"ready_s": list(it.ready_s)}
            if it.fwd_s is not None:
                rec["fwd_s"] = list(it.fwd_s)
            if it.iteration_s is not None:
                rec["iteration_s"] = it.iteration_s
            if it.bandwidth_Bps is not None:
                rec["bandwidth_Bps"] = it.bandwidth_Bps
            iterations.append(rec)
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "framework": self.framework,
            "batch": self.batch,
            "device": self.device,
            "world_size": self.world_size,
            "tensors": [
                {"index": i, "name": t.name, "shape": list(t.shape), "dtype": t.dtype, "itemsize": t.itemsize}
                for i, t in enumerate(self.tensors)
            ],
            "iterations": iterations,
        }
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    def to_json(self, indent: int | None = 1) -> str:
        """The profile as JSON text (validated first: an invalid profile is never written)."""
        data = self.to_dict()
        Profile.from_dict(data, source=f"profile of {self.model!r}")
        try:
            return json.dumps(data, indent=indent, allow_nan=False)
        except (TypeError, ValueError) as err:  # meta holding something JSON cannot carry
            raise UserError(f"profile of {self.model!r}: field 'meta' is not JSON-serialisable: {err}") from None

    def save(self, path: str | os.PathLike) -> None:
        text = self.to_json()
        tmp = f"{os.fspath(path)}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.write("\n")
            os.replace(tmp, path)
        except OSError as err:
            raise UserError(f"{os.fspath(path)}: cannot write profile: {err.strerror or err}") from None

    @classmethod
    def from_dict(cls, data: Any, source: str = "<profile>") -> "Profile":
        """Build a profile from its JSON form, validating every field (UserError names the first bad one)."""
        return _Validator(source).profile(data)

    # -- statistics ------------------------------------------------------------------------------
    @property
    def iteration_s(self) -> float | None:
        """Median measured iteration time, or None if no iteration recorded one."""
        values = [it.iteration_s for it in self.iterations if it.iteration_s is not None]
        return statistics.median(values) if values else None

    @property
    def bandwidth_Bps(self) -> float | None:
        """Median measured bandwidth (bytes/s), or None if none was recorded."""
        values = [it.bandwidth_Bps for it in self.iterations if it.bandwidth_Bps is not None]
        return statistics.median(values) if values else None

    def median_ready_s(self) -> tuple[float | None, ...]:
        """Per tensor (forward order), the median ready time over the iterations that saw it."""
        out = []
        for i in range(len(self.tensors)):
            values = [it.ready_s[i] for it in self.iterations if it.ready_s[i] is not None]
            out.append(statistics.median(values) if values else None)
        return tuple(out)

    def backward_times(self) -> dict[int, float]:
        """Per tensor that produced a gradient (forward index -> seconds): the gap between its median
        ready time and the latest of the tensors after it (backward runs from the last index down)."""
        return backward_gaps(self.median_ready_s())

    def with_forward_total(self, seconds: float) -> "Profile":
        """This profile with a forward time for every tensor: ``seconds`` (a whole forward pass, timed
        where no layer's forward can be: MXNet's asynchronous engine) spread as the backward times are."""
        bwd = self.backward_times()
        total = sum(bwd.values())
        if total <= 0:
            return self
        fwd = tuple(seconds * bwd[i] / total if i in bwd else None for i in range(len(self.tensors)))
        return dataclasses.replace(self, iterations=tuple(dataclasses.replace(it, fwd_s=fwd)
                                                          for it in self.iterations))

    def median_fwd_s(self) -> tuple[float | None, ...]:
        """Per tensor, the median of its recorded forward times (None: never recorded)."""
        out = []
        for i in range(len(self.tensors)):
            values = [it.fwd_s[i] for it in self.iterations if it.fwd_s is not None and it.fwd_s[i] is not None]
            out.append(statistics.median(values) if values else None)
        return tuple(out)


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile file. Any problem raises a one-line UserError naming file and field."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise UserError(f"{source}: cannot read profile: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise UserError(f"{source}: not a profile: the file is not UTF-8 text") from None

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not allowed")

    try:
        data = json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as err:
        raise UserError(f"{source}: not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}") from None
    except ValueError as err:
        raise UserError(f"{source}: not valid JSON: {err}") from None
    return Profile.from_dict(data, source=source)


class _Validator:
    """Checks the JSON form field by field; the first problem becomes a one-line UserError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> None:
        raise UserError(f"{self.source}: bad field '{path}': {problem}")

    def obj(self, value: Any, path: str, required: Sequence[str], optional: Sequence[str]) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"must be an object, got {_kind(value)}")
        for key in required:
            if key not in value:
                raise UserError(f"{self.source}: missing field '{_join(path, key)}'")
        for key in value:
            if key not in required and key not in optional:
                allowed = ", ".join((*required, *optional))
                self.fail(_join(path, str(key)), f"unknown field; valid fields here: {allowed}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(path, f"must be a non-empty string, got {_kind(value)}")
        return value

    def integer(self, value: Any, path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, got {_kind(value)}")
        if value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        return value

    def number(self, value: Any, path: str, *, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"must be a number, got {_kind(value)}")
        if not math.isfinite(value):
            self.fail(path, f"must be finite, got {value}")
        if positive and value <= 0:
            self.fail(path, f"must be > 0, got {value}")
        if value < 0:
            self.fail(path, f"must be >= 0, got {value}")
        return float(value)

    def times(self, value: Any, path: str, n: int) -> tuple[float | None, ...]:
        if not isinstance(value, list):
            self.fail(path, f"must be a list of {n} numbers (null = not observed), got {_kind(value)}")
        if len(value) != n:
            self.fail(path, f"must have one entry per tensor ({n}), got {len(value)}")
        return tuple(None if v is None else self.number(v, f"{path}[{i}]") for i, v in enumerate(value))

    def profile(self, data: Any) -> Profile:
        top = self.obj(data, "", _TOP_REQUIRED, _TOP_OPTIONAL)
        if top["format"] != FORMAT:
            self.fail("format", f"must be {FORMAT!r}, got {top['format']!r}")
        version = top["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
            self.fail("version", f"unsupported version {version!r}; this build reads: "
                                 f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
        model = self.string(top["model"], "model")
        framework = top["framework"]
        if framework not in FRAMEWORKS:
            self.fail("framework", f"unknown framework {framework!r}; valid: {', '.join(FRAMEWORKS)}")
        device = self.string(top["device"], "device")
        batch = self.integer(top["batch"], "batch", 1)
        world_size = self.integer(top["world_size"], "world_size", 1)
        meta = top.get("meta", {})
        if not isinstance(meta, dict):
            self.fail("meta", f"must be an object, got {_kind(meta)}")

        raw_tensors = top["tensors"]
        if not isinstance(raw_tensors, list) or not raw_tensors:
            self.fail("tensors", "must be a non-empty list of tensors in forward order")
        tensors = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(raw_tensors):
            path = f"tensors[{i}]"
            t = self.obj(raw, path, _TENSOR_REQUIRED, _TENSOR_OPTIONAL)
            index = self.integer(t["index"], f"{path}.index", 0)
            if index != i:
                self.fail(f"{path}.index", f"must equal its position {i} (tensors are listed in forward order), got {index}")
            name = self.string(t["name"], f"{path}.name")
            if name in seen:
                self.fail(f"{path}.name", f"duplicate name {name!r} (also tensors[{seen[name]}])")
            seen[name] = i
            shape = t["shape"]
            if not isinstance(shape, list):
                self.fail(f"{path}.shape", f"must be a list of dimension sizes, got {_kind(shape)}")
            dims = tuple(self.integer(d, f"{path}.shape[{k}]", 0) for k, d in enumerate(shape))
            dtype = t["dtype"]
            if dtype not in DTYPES:
                self.fail(f"{path}.dtype", f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
            if "itemsize" in t and t["itemsize"] != DTYPES[dtype]:
                self.fail(f"{path}.itemsize", f"must be {DTYPES[dtype]} for {dtype}, got {t['itemsize']!r}")
            tensors.append(ProfileTensor(name, dims, dtype))

        raw_iters = top["iterations"]
        if not isinstance(raw_iters, list) or not raw_iters:
            self.fail("iterations", "must be a non-empty list of recorded iterations")
        n = len(tensors)
        iterations = []
        for j, raw in enumerate(raw_iters):
            path = f"iterations[{j}]"
            it = self.obj(raw, path, _ITER_REQUIRED, _ITER_OPTIONAL)
            ready = self.times(it["ready_s"], f"{path}.ready_s", n)
            if all(r is None for r in ready):
                self.fail(f"{path}.ready_s", "no gradient became ready in this iteration (all null)")
            fwd = None if it.get("fwd_s") is None else self.times(it["fwd_s"], f"{path}.fwd_s", n)
            iteration_s = None
            if it.get("iteration_s") is not None:
                iteration_s = self.number(it["iteration_s"], f"{path}.iteration_s", positive=True)
                limit = iteration_s * (1 + _REL_TOL)
                for k, r in enumerate(ready):
                    if r is not None and r > limit:
                        self.fail(f"{path}.ready_s[{k}]",
                                  f"ready {r} s after backward start, later than the whole iteration ({iteration_s} s)")
                if fwd is not None:
                    total = sum(f for f in fwd if f is not None)
                    if total > limit:
                        self.fail(f"{path}.fwd_s", f"forward times sum to {total} s, more than the iteration ({iteration_s} s)")
            bandwidth = None
            if it.get("bandwidth_Bps") is not None:
                bandwidth = self.number(it["bandwidth_Bps"], f"{path}.bandwidth_Bps", positive=True)
            iterations.append(IterationRecord(ready, fwd, iteration_s, bandwidth))

        return Profile(model, framework, batch, device, world_size, tuple(tensors), tuple(iterations), meta)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, (int, float, str)):
        return f"{type(value).__name__} {value!r}"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


class ProfileRecorder:
    """Collects a profile from plugin hooks. Times are passed in (any clock, seconds); it has none.

    Per iteration the plugin calls::

        begin_iteration(t)          # the iteration starts (forward begins)
        forward_time(name, secs)    # optional: forward time of the layer this tensor parameterises
        backward_start(t)           # optional: backward begins (default: the begin_iteration time)
        gradient_ready(name, t)     # each gradient, as its hook fires
        end_iteration(t, bandwidth_Bps=None)

    A plugin that only sees gradients may call ``begin_iteration`` at backward start. A gradient
    reported twice in one iteration (gradient accumulation) keeps the last time: that is when the
    summed gradient is ready. A ``begin_iteration`` while an iteration is open abandons the open one
    (e.g. the step raised). The first ``warmup`` completed iterations are dropped (cuDNN autotuning,
    allocator warm-up); at most ``max_iterations`` (the newest) are kept.
    """

    def __init__(self, tensors: Iterable[ProfileTensor | Sequence[Any]], *, model: str, framework: str,
                 batch: int, device: str = "unknown", world_size: int = 1, warmup: int = 0,
                 max_iterations: int | None = None, meta: Mapping[str, Any] | None = None) -> None:
        specs = []
        for t in tensors:
            if isinstance(t, ProfileTensor):
                specs.append(t)
            else:
                name, shape, *rest = t
                specs.append(ProfileTensor(name, tuple(int(d) for d in shape), *rest))
        if not specs:
            raise UserError("ProfileRecorder: no tensors to profile (pass the model's parameters in forward order)")
        self._tensors = tuple(specs)
        self._index: dict[str, int] = {}
        for i, t in enumerate(self._tensors):
            if t.dtype not in DTYPES:
                raise UserError(f"ProfileRecorder: tensor {t.name!r} has unknown dtype {t.dtype!r}; valid: {', '.join(DTYPES)}")
            if t.name in self._index:
                raise UserError(f"ProfileRecorder: duplicate tensor name {t.name!r}")
            self._index[t.name] = i
        if framework not in FRAMEWORKS:
            raise UserError(f"ProfileRecorder: unknown framework {framework!r}; valid: {', '.join(FRAMEWORKS)}")
        check = _Validator("ProfileRecorder")
        check.string(model, "model")
        check.string(device, "device")
        check.integer(batch, "batch", 1)
        check.integer(world_size, "world_size", 1)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise UserError(f"ProfileRecorder: warmup must be an integer >= 0, got {warmup!r}")
        if max_iterations is not None and (isinstance(max_iterations, bool) or not isinstance(max_iterations, int)
                                           or max_iterations < 1):
            raise UserError(f"ProfileRecorder: max_iterations must be an integer >= 1 or None, got {max_iterations!r}")
        self._header = dict(model=model, framework=framework, batch=batch, device=device, world_size=world_size)
        self._meta = dict(meta or {})
        self._warmup_left = warmup
        self._max = max_iterations
        self._done: list[IterationRecord] = []
        self.abandoned = 0
        self._open = False
        self._begin = self._bwd_start = 0.0
        self._ready: list[float | None] = []
        self._fwd: list[float | None] = []

    @property
    def tensors(self) -> tuple[ProfileTensor, ...]:
        return self._tensors

    @property
    def iterations_recorded(self) -> int:
        return len(self._done)

    def begin_iteration(self, t: float) -> None:
        t = _time(t, "begin_iteration")
        if self._open:
            self.abandoned += 1
        self._open = True
        self._begin = self._bwd_start = t
        self._ready = [None] * len(self._tensors)
        self._fwd = [None] * len(self._tensors)

    def backward_start(self, t: float) -> None:
        t = _time(t, "backward_start")
        self._require_open("backward_start")
        if t < self._begin:
            raise UserError(f"ProfileRecorder.backward_start: time {t} is before the iteration began ({self._begin})")
        self._bwd_start = t

    def forward_time(self, name: str, seconds: float) -> None:
        seconds = _time(seconds, "forward_time")
        self._require_open("forward_time")
        if seconds < 0:
            raise UserError(f"ProfileRecorder.forward_time: {name!r} took {seconds} s; must be >= 0")
        self._fwd[self._lookup(name, "forward_time")] = seconds

    def gradient_ready(self, name: str, t: float) -> None:
        t = _time(t, "gradient_ready")
        self._require_open("gradient_ready")
        i = self._lookup(name, "gradient_ready")
        if t < self._bwd_start:
            raise UserError(f"ProfileRecorder.gradient_ready: {name!r} ready at {t}, before backward started ({self._bwd_start})")
        self._ready[i] = t - self._bwd_start

    def end_iteration(self, t: float, *, bandwidth_Bps: float | None = None) -> bool:
        """Close the iteration; True if it was recorded (not warm-up, at least one gradient seen)."""
        t = _time(t, "end_iteration")
        self._require_open("end_iteration")
        latest = max((r for r in self._ready if r is not None), default=None)
        if latest is not None and t < self._bwd_start + latest - _REL_TOL * max(1.0, abs(t)):
            raise UserError(f"ProfileRecorder.end_iteration: time {t} is before the last gradient was ready "
                            f"({self._bwd_start + latest})")
        if bandwidth_Bps is not None and not (isinstance(bandwidth_Bps, (int, float)) and
                                              math.isfinite(bandwidth_Bps) and bandwidth_Bps > 0):
            raise UserError(f"ProfileRecorder.end_iteration: bandwidth_Bps must be a number > 0, got {bandwidth_Bps!r}")
        self._open = False
        if latest is None:
            return False
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return False
        # Never shorter than the backward part it contains (absorbs float rounding of the inputs).
        iteration_s = max(t - self._begin, self._bwd_start - self._begin + latest)
        fwd = tuple(self._fwd) if any(f is not None for f in self._fwd) else None
        self._done.append(IterationRecord(tuple(self._ready), fwd, iteration_s if iteration_s > 0 else None,
                                          None if bandwidth_Bps is None else float(bandwidth_Bps)))
        if self._max is not None and len(self._done) > self._max:
            del self._done[0]
        return True

    def profile(self) -> Profile:
        """The profile so far (validated). Needs at least one recorded iteration."""
        if not self._done:
            raise UserError("ProfileRecorder.profile: no iteration recorded yet "
                            "(call begin_iteration / gradient_ready / end_iteration first)")
        p = Profile(tensors=self._tensors, iterations=tuple(self._done), meta=dict(self._meta), **self._header)
        return Profile.from_dict(p.to_dict(), source="ProfileRecorder")

    def _require_open(self, method: str) -> None:
        if not self._open:
            raise UserError(f"ProfileRecorder.{method}: no iteration open (call begin_iteration first)")

    def _lookup(self, name: str, method: str) -> int:
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise UserError(f"ProfileRecorder.{method}: unknown tensor {name!r}; valid: the "
                            f"{len(self._tensors)} tensors given at construction "
                            f"(first {self._tensors[0].name!r}, last {self._tensors[-1].name!r})") from None


def _time(value: Any, method: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"ProfileRecorder.{method}: time must be a finite number of seconds, got {value!r}")
    return float(value)


def backward_gaps(ready: tuple[float | None, ...]) -> dict[int, float]:
    """Per tensor with a gradient, its backward time from ready times ``ready`` (the medians, or one
    iteration's; None: no gradient): the gap to the latest ready time of the tensors after it."""
    bwd, latest = {}, 0.0
    for i, r in reversed(list(enumerate(ready))):
        if r is not None:
            bwd[i] = max(r, latest) - latest
            latest = max(latest, r)
    return bwd

