"""The PyTorch plugin's face: ``DistributedOptimizer``, a drop-in for ``byteps.torch.DistributedOptimizer``.

``DistributedOptimizer(optimizer, named_parameters, compression, backward_passes_per_step, **settings)``
returns an object of a subclass of the optimizer's own class that shares its parameter groups and
state, with a :class:`~byteps_prophet.torch.gradient_engine.GradientEngine` behind it (hooks ->
scheduler -> backend -> per-parameter update). ``step()`` returns when every parameter is updated, as
stock BytePS's does, so a script sees the same parameters wherever it looks (docs/DESIGN.md, "Stock
step() semantics by default"); with ``overlap`` (``BYTEPS_PROPHET_OVERLAP=1``) it returns at once and
each module's next forward waits for its own parameters' updates, while ``state_dict()``,
``synchronize()`` and ``close()`` wait for all; parameters read any other way may then be one update
behind. ``synchronize()`` waits for the averaged gradients only, so the clipping idiom
(``synchronize()``, clip, ``step()`` in ``skip_synchronize()``) works as with BytePS. Without
``layerwise`` (``BYTEPS_PROPHET_LAYERWISE=0``) ``step()`` waits for every gradient, then steps the
whole optimizer at once.

Settings (README "Settings") come from the environment, each overridden by a keyword argument of its
field's name (``scheduler="prophet"``, ``overlap=True``, ``credit=...``).
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import sys
import weakref

import torch

from byteps_prophet.backends import Backend, make_backend
from byteps_prophet.backends.base import close_each
from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.core import Settings
from byteps_prophet.errors import ConfigError
from byteps_prophet.torch.compression import Compression
from byteps_prophet.torch.gradient_engine import GradientEngine
from byteps_prophet.torch.listeners import ProfileListener


def default_backend_name(settings: Settings | None = None) -> str:
    """``BYTEPS_PROPHET_BACKEND`` (``settings.backend``), else what the process is: an initialised
    torch.distributed group's, a BytePS worker's, gloo for several ranks, local for one."""
    name = (Settings.from_env() if settings is None else settings).backend
    if name:
        return name
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return "nccl" if dist.get_backend() == "nccl" else "gloo"
    where = rendezvous()
    if where.role == "worker":
        return "byteps"
    if where.world_size > 1:
        return "gloo"
    return "local"


class _DistributedMixin:
    """Overrides mixed in front of the user's optimizer class; the work is the engine's."""

    _engine: GradientEngine

    def step(self, closure=None):
        engine = self._engine
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        engine.finish_backward()
        if not engine.layerwise:
            engine.updates.wait_all()
            engine.base_cls.step(self)
        else:
            engine.updates.apply_held(engine.iteration)
            if not engine.overlap:
                engine.updates.wait_all()
        engine.step_done()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self._engine.updates.zero_grad(self.param_groups, self._engine.by_id, set_to_none)

    def synchronize(self):
        """Wait until every gradient is averaged; the update waits for ``step()`` (call it inside
        ``skip_synchronize()``), so the gradients can be read or clipped in between, as with BytePS."""
        self._engine.finish_backward(stepping=False)
        self._engine.updates.wait_all()  # every gradient averaged; with overlap, the last step's updates landed too

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    def state_dict(self):
        self._engine.updates.wait_all()
        return super().state_dict()

    def load_state_dict(self, state_dict):
        self._engine.updates.wait_all()
        super().load_state_dict(state_dict)
        for entry in self._engine.params:  # the twins share the (new) state
            entry.twin.state = self.state
            group = next(g for g in self.param_groups if any(p is entry.param for p in g["params"]))
            entry.group = group

    def close(self):
        """Wait for outstanding work, remove the hooks, write the profile, leave the process group."""
        self._engine.close()

    def save_profile(self, path: str | None = None) -> str | None:
        recorder = self._engine.listener(ProfileListener)
        return None if recorder is None else recorder.save(path)

    @property
    def scheduler(self):
        return self._engine.scheduler


_LIVE: "weakref.WeakSet[GradientEngine]" = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Close every live optimizer (its last updates land, its threads end): at interpreter exit, and
    from the patched ``byteps.torch.shutdown()`` before BytePS stops. After an unhandled exception
    (Ctrl-C too; Python sets ``sys.last_value`` before the exit handlers) nothing is waited for: the
    other ranks may be blocked on this one, and its launcher ends the job once it exits."""
    close_each(_LIVE, "optimizer")


_OWN_KEYWORDS = ("settings", "backend", "model_name", "batch_size")


def _settings(settings: Settings | None, knobs: dict) -> Settings:
    """``settings`` (default: the environment) with each keyword a user passed as the value of the
    field it names; None leaves the field as it was. An unknown name is a one-line ConfigError."""
    fields = [f.name for f in dataclasses.fields(Settings)]
    unknown = sorted(set(knobs) - set(fields))
    if unknown:
        raise ConfigError(f"DistributedOptimizer: unknown keyword argument {unknown[0]!r}; valid: "
                          f"{', '.join(_OWN_KEYWORDS)} or a setting: {', '.join(fields)}")
    knobs = {name: value for name, value in knobs.items() if value is not None}
    if isinstance(knobs.get("scheduler"), str):
        knobs["scheduler"] = knobs["scheduler"].strip().lower()
    return Settings.from_env(overrides=knobs) if settings is None else settings.replace(**knobs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, *, settings: Settings | None = None,
                         backend: str | Backend | None = None, model_name: str = "model", batch_size: int = 1,
                         **knobs):
    """A drop-in for ``byteps.torch.DistributedOptimizer`` scheduled by FIFO, ByteScheduler or Prophet.

    Every ``Settings`` field is a keyword argument (``scheduler="prophet"``, ``overlap=True``,
    ``credit=...``, ``profile=PATH``), with the environment (or ``settings``, replacing it as a whole)
    as the fallback. ``backend`` is a backend's name (the setting) or a made :class:`Backend`;
    ``model_name`` and ``batch_size`` describe the run in the recorded profile.
    """
    made = backend if isinstance(backend, Backend) else None
    settings = _settings(settings, knobs if made else dict(knobs, backend=backend))
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ConfigError(f"backward_passes_per_step={backward_passes_per_step!r} is invalid; valid: an integer >= 1")
    if named_parameters is None:
        named = [(f"param.{i}.{j}", p) for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])]
    else:
        named = list(named_parameters)
    if isinstance(optimizer, _DistributedMixin):
        raise ConfigError("DistributedOptimizer: this optimizer is already distributed; valid: a torch.optim optimizer")
    backend = made or make_backend(default_backend_name(settings))

    base = type(optimizer)
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": __name__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    engine = GradientEngine(wrapped, base, named, compression, backward_passes_per_step, settings, backend,
                            model_name=model_name, batch_size=batch_size)
    wrapped._engine = engine
    _LIVE.add(engine)
    return wrapped


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Make every rank's parameters (a state_dict or named_parameters) equal to ``root_rank``'s."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    items = params.items() if hasattr(params, "items") else params
    with torch.no_grad():
        for _, tensor in sorted(items, key=lambda kv: kv[0]):
            if torch.is_tensor(tensor):
                dist.broadcast(tensor.data if hasattr(tensor, "data") else tensor, src=root_rank)