"""A recorded profile (``byteps_prophet.profile``) as the simulator's model and compute.

The profile module records and validates; this one, in the simulator, turns a profile into what the
simulator replays: a ``ModelSpec`` of the recorded tensors and their ``LayerTimes``.

* :func:`model_and_times`: the model and the median iteration's compute;
* :func:`iteration_times`: the compute of each recorded iteration, in the order recorded.
"""
from __future__ import annotations

from byteps_prophet.errors import UserError
from byteps_prophet.profile import Profile, backward_gaps
from byteps_prophet.sim.costmodel import LayerTimes
from byteps_prophet.sim.zoo import ModelSpec, TensorSpec

FWD_FROM_BWD = 0.5  # forward time of a tensor without a recorded one = 0.5 x its backward time


def model_and_times(profile: Profile) -> tuple[ModelSpec, LayerTimes]:
    """The simulator's inputs: a ModelSpec of the recorded tensors and their measured times.

    * Ready time of each tensor: the median over iterations (robust to a slow iteration).
    * Tensors that never produced a gradient (unused parameters) are left out of the model: no
      gradient of theirs is ever communicated. A forward time recorded for one is added to the
      nearest kept tensor before it (or the first kept tensor).
    * Backward time of tensor i = the gap between its ready time and the latest ready time of
      the tensors after it (backward order: from the last index down). For a profile whose ready
      times fall as the index rises (the usual case) this is exactly ``R_i - R_(i+1)``, and
      ``LayerTimes.ready_times()`` reproduces the medians. A tensor ready earlier than a
      later-index one gets 0 and is replayed as ready together with it (conservative).
    * Forward time: the median of the recorded ones. A tensor without one in a profile that
      records forward times has no forward of its own: the torch probe puts a layer's forward on
      its first tensor (a bias's forward is its weight's), so it gets 0. Only a profile with no
      forward times at all (MXNet's) takes ``FWD_FROM_BWD x`` each tensor's backward time
      (backward does about twice forward's work).
    * The ModelSpec carries no FLOPs (0): its times come from the record, not the cost model.
    """
    ready = profile.median_ready_s()
    kept = _kept(profile, ready)
    tensors = tuple(
        TensorSpec(profile.tensors[i].name, profile.tensors[i].shape, 0.0, 0.0,
                   itemsize=profile.tensors[i].itemsize)
        for i in kept
    )
    model = ModelSpec(profile.model, tensors, profile.batch)
    return model, _layer_times(profile, kept, ready, profile.median_fwd_s(), backward_gaps(ready))


def iteration_times(profile: Profile) -> tuple[LayerTimes, ...]:
    """The simulator's compute of each recorded iteration, in the order recorded (the tensors of
    ``model_and_times``): each iteration's own ready times and forward times, the medians where
    it has none. Replayed in turn they carry the recording's variation from one iteration to the
    next, which a scheduler that predicts from past iterations has to live with."""
    ready_med, fwd_med = profile.median_ready_s(), profile.median_fwd_s()
    kept = _kept(profile, ready_med)
    out = []
    for it in profile.iterations:
        ready = tuple(r if r is not None else m for r, m in zip(it.ready_s, ready_med))
        fwd = fwd_med if it.fwd_s is None else tuple(f if f is not None else m
                                                     for f, m in zip(it.fwd_s, fwd_med))
        out.append(_layer_times(profile, kept, ready, fwd, backward_gaps(ready)))
    return tuple(out)


def _kept(profile: Profile, ready: tuple[float | None, ...]) -> list[int]:
    """The tensors that produced a gradient (unused parameters are left out of the model)."""
    kept = [i for i, r in enumerate(ready) if r is not None]
    if not kept:  # cannot happen for a validated profile; keeps the contract explicit
        raise UserError(f"profile of {profile.model!r}: no tensor ever produced a gradient")
    return kept


def _layer_times(profile: Profile, kept: list[int], ready: tuple[float | None, ...],
                 fwd_recorded: tuple[float | None, ...], bwd: dict[int, float]) -> LayerTimes:
    """``LayerTimes`` of the ``kept`` tensors from backward gaps and forward times (None: not
    recorded), by the rules of ``model_and_times``."""
    recorded = any(it.fwd_s is not None for it in profile.iterations)
    fwd = {i: fwd_recorded[i] if fwd_recorded[i] is not None else 0.0 if recorded else FWD_FROM_BWD * bwd[i]
           for i in kept}
    for i, value in enumerate(fwd_recorded):  # fold unused tensors' forward time into a kept one
        if ready[i] is None and value is not None:
            before = [k for k in kept if k < i]
            fwd[before[-1] if before else kept[0]] += value
    return LayerTimes(tuple(fwd[i] for i in kept), tuple(bwd[i] for i in kept))
