"""From the probe's raw timings to :class:`~byteps_prophet.core.traits.EngineTraits` (pure Python).

The probe (``probe.py``) reports, per micro-benchmark, when each op was issued and when it completed
on worker 0; this module decides what they mean (docs/ENGINE.md, "How calibrate measures"):

* **link rate and start-up latency**: ops of three sizes each sent onto an idle link: the core's
  least-squares line (``core/bandwidth.py``'s ``RunningFit``) of time in flight against the bytes
  they carry over the bottleneck (stages x link bytes) gives the rate (1 / slope); its intercept,
  less the per-message cost on every stage, is the start-up latency;
* **per-message cost**: ops of several sizes sent back to back. An op already in flight when the
  previous one completed was queued on a busy link (the rule of ``core/link_monitor.py``); the slope of
  completion times over such ops is one service sample (link bytes, seconds) per group, and the
  intercept of the same least-squares line through them is the cost;
* **pulls follow pushes** (parameter servers): a small op sent just before a large one, against the
  same op alone: it finishing only after most of the large push means its pull queued behind it;
* **back-pressure** (the same two ops, with more workers than servers): the small op waiting longer
  than halfway from the large push at the worker's own pace (its link alone) to the same push at the
  server's (its ingress shared by every worker's push) means the worker's queue drained only as the
  server took it;
* **duplex**: on a parameter server, a second large op issued 1.25 push times after the first: both
  done after 3.25 one-way transfers on a duplex link, 4 on a half-duplex one. For an all-reduce, the
  measured rate against the shaped one;
* **duplex efficiency**: on a duplex link, what the same two ops took beyond 3.25 transfers, over the
  0.75 transfers both directions were busy: each direction's share of its rate while both are;
* **pull in reply** (MXNet's KVStore, probed with ``pushpull``, the call its scheduled store sends
  atoms with): the same small-before-large pair, as one request each: the small op's answer not
  waiting for the large push (as it does with a push and a pull request of its own) means the server
  answers the push with the values;
* **duplex efficiency, from long streams**: streams that keep both directions of the server's link
  busy for most of their time, as training does (the staggered pair overlaps them for 0.75 transfers
  only), replayed by the simulator's network (``sim/network.py``, ``replay_fit``): the efficiency it
  finishes them with when they finished: BytePS's windowed push_pull streams (with its largest
  back-to-back groups), the KVStore's ``pushpull`` bursts and windowed streams, where the pull comes
  in the reply;
* **compute slowdown**: a fixed CPU workload while the engine moves bytes, over the same alone;
* **comm slowdown**: the same bytes moved beside that workload, over moved alone.

"Link bytes" are what the busiest link carries per op in each direction: a ring all-reduce of S bytes
over n workers moves 2(n-1)/n S over every link; a parameter server's link carries the pushes of every
worker it serves, S * workers / servers (at least S, the worker's own link).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from byteps_prophet.core.bandwidth import RunningFit
from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.errors import ConfigError

BACKENDS = ("byteps", "kvstore", "gloo")
# The atoms the plugins send Prophet's slices as (torch/BytePS: BYTEPS_PROPHET_ATOM_ELEMENTS, the MXNet
# stores: PROPHET_MXNET_ATOM_ELEMENTS; both default to a quarter of ByteScheduler's partition);
# torch.distributed sends any slice as it is.
DEFAULT_ATOM_ELEMENTS = 250_000
FOLLOW_SHARE = 0.5  # of the large push's service a small op must wait for to be "behind" it
# Two large ops, the second issued 1.25 push times after the first (probe.STAGGER): a duplex link
# finishes both after 3.25 one-way transfers (the first's pull overlaps the second's push), a
# half-duplex one after 4. (Issued right at the end of the first push, a duplex link whose pulls
# follow pushes reads as half-duplex: the first's pull request queues behind the second's push.)
DUPLEX_TRANSFERS = 3.6
# Of those 3.25, the first's pull and the second's push overlap for 0.75 transfers; a link whose
# directions run at a share e of their rate while both are busy takes 0.75 (1 / e - 1) longer.
DUPLEX_IDEAL, STAGGER_OVERLAP = 3.25, 0.75
DUPLEX_SHARE = 0.6  # all-reduce: measured rate at least this share of the shaped one


def _took(group: Mapping[str, Any]) -> float:
    return max(group["done"]) - group["issued"][0]


def streams_of(traits: EngineTraits, groups: Sequence[Mapping[str, Any]]) -> list[tuple]:
    """``(traits, window, ops, tensor bytes, took s)`` per group of probe ops: a back-to-back group
    (every op issued at once: its window is its ops) or a windowed stream (``window`` in flight)."""
    return [(traits, int(g.get("window") or len(g["done"])), len(g["done"]), int(g["tensor_bytes"]), _took(g))
            for g in groups if len(g["done"]) >= 2]


def replay_fit(streams: Sequence[tuple], workers: int, rate: float, efficiency: float, *, fit_rate: bool = False,
               fit_efficiency: bool = True) -> tuple[float, float, list[list]]:
    """``(rate, duplex_efficiency, fits)`` with which the simulator's network (``sim/network.py``,
    ``stream_done_s``) finishes the probe's ``streams`` (``streams_of``) closest to when they did:
    least squares of the log ratio over all of them on a grid (rate in 2% steps around ``rate``, then
    0.25% and 0.03%; efficiency in [0.5, 1] in 0.05 steps, then 0.005 and 0.001); what is not fitted
    stays as given. One value fitted to all, not a median of each stream's own: a stream with a deep
    window hardly depends on the efficiency (its pulls wait behind pushes anyway), so its own fit swings
    with every millisecond of noise. ``fits``: per stream ``[window, ops, took s, simulated s]``."""
    from byteps_prophet.sim.replay import stream_done_s

    if not streams:
        raise ValueError("no streams to fit")

    def simulated(r: float, e: float) -> list[float]:
        return [max(stream_done_s(traits.replace(duplex_efficiency=e), r, workers, tensor, ops, window))
                for traits, window, ops, tensor, _ in streams]

    def misfit(point: tuple[float, float]) -> float:
        return sum(math.log(sim / stream[-1]) ** 2 for sim, stream in zip(simulated(*point), streams))

    best = (rate, efficiency)
    for rate_step, e_step in ((0.02, 0.05), (0.0025, 0.005), (0.0003, 0.001)):
        rates = [best[0] * (1 + rate_step * k) for k in range(-10, 11)] if fit_rate else [best[0]]
        effs = ([min(1.0, max(0.5, best[1] + e_step * k)) for k in range(-10, 11)] if fit_efficiency
                else [best[1]])
        best = min(((r, e) for r in rates for e in dict.fromkeys(effs)), key=misfit)
    fits = [[window, ops, round(took, 6), round(sim, 6)]
            for sim, (_, window, ops, _, took) in zip(simulated(*best), streams)]
    return best[0], round(best[1], 4), fits


def stages_of(backend: str) -> int:
    return 1 if backend == "gloo" else 2


def link_factor(backend: str, workers: int, servers: int) -> float:
    """Link bytes per tensor byte (module docstring)."""
    if workers < 1:
        raise ConfigError(f"workers {workers} is invalid; valid: an integer >= 1")
    if stages_of(backend) == 1:
        return 2 * (workers - 1) / workers if workers > 1 else 1.0
    return max(1.0, workers / max(1, servers))


def service_samples(stream: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """One (link bytes, seconds) sample per back-to-back group: the least-squares slope of the
    completion times against the ops' positions, over the ops that were already in flight when the one
    before them completed. A slope, not the median gap: an engine that runs two collectives at once
    (gloo) completes them in pairs, gaps alternating short and long, and only their mean is the link's."""
    samples = []
    for group in stream:
        issued, done = group["issued"], group["done"]
        last = 1
        while last < len(done) and issued[last] < done[last - 1]:
            last += 1
        points = done[:last]
        n = len(points)
        if n < 2:
            continue
        mean_i = (n - 1) / 2
        mean_t = sum(points) / n
        var_i = sum((i - mean_i) ** 2 for i in range(n))
        slope = sum((i - mean_i) * (t - mean_t) for i, t in enumerate(points)) / var_i
        if slope > 0:
            samples.append((float(group["link_bytes"]), slope))
    return samples


def fit_link(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(message_cost_s, bytes_per_s)`` from service samples: the core's least-squares line; when the
    sizes do not spread enough to separate cost from rate, a line through the origin (cost 0)."""
    if not samples:
        raise ConfigError("calibration: no back-to-back completions to fit; valid: a probe output with "
                          "'stream' groups of at least 2 ops")
    line = RunningFit(window=max(len(samples), 1))
    for x, y in samples:
        line.add(x, y)
    fitted = line.fit()
    if fitted is not None:
        cost, slope = fitted
        return cost, 1.0 / slope
    total_x = sum(x for x, _ in samples)
    total_y = sum(y for _, y in samples)
    if total_x <= 0 or total_y <= 0:
        raise ConfigError("calibration: the back-to-back samples carry no bytes or took no time")
    return 0.0, total_x / total_y


def _median(values: Sequence[float], what: str) -> float:
    if not values:
        raise ConfigError(f"calibration: no {what} samples in the probe output")
    return statistics.median(values)


def traits_from(raw: Mapping[str, Any], *, nominal_bytes_per_s: float | None = None,
                atom_elements: int | None = None) -> tuple[EngineTraits, dict[str, Any]]:
    """The traits the probe's output ``raw`` shows, and the derived figures behind each (for the
    profile's "measured" record). ``nominal_bytes_per_s``: the shaped rate (None: unshaped)."""
    try:
        backend = raw["backend"]
        workers, servers = int(raw["workers"]), int(raw.get("servers", 0))
        stream, alone = raw["stream"], raw["alone"]
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"calibration: the probe output lacks {err}; valid: the JSON line of "
                          f"byteps_prophet.calibrate.probe") from None
    if backend not in BACKENDS:
        raise ConfigError(f"calibration: backend {backend!r} is unknown; valid: {', '.join(BACKENDS)}")
    stages = stages_of(backend)
    samples = service_samples(stream)
    cost, stream_rate = fit_link(samples)
    # The rate from ops alone on an idle link (a line through flight time against the bytes each
    # crosses the bottleneck with): back to back, BytePS and the KVStore interleave a burst of pushes
    # and complete the ops in bunches at its end, so completion gaps read the link well above its
    # shaped rate; an op alone has no one to share with.
    alone_line = RunningFit(window=10_000)
    for entry in alone.values():
        for flight in entry["flight_s"]:
            alone_line.add(stages * float(entry["link_bytes"]), flight)
    fitted = alone_line.fit()
    small, big = alone["small"], alone["big"]
    small_alone = _median(small["flight_s"], "small op alone")
    if fitted is not None:
        intercept, slope = fitted
        rate = 1.0 / slope
    else:  # the sizes alone do not spread (an old probe output): the back-to-back line
        rate = stream_rate
        intercept = max(0.0, small_alone - stages * small["link_bytes"] / rate)
    cost = min(cost, intercept / stages)  # never more than what an op alone paid besides its bytes
    startup = max(0.0, intercept - stages * cost)
    small_service = stages * (cost + small["link_bytes"] / rate)

    derived: dict[str, Any] = {
        "service_samples": [[x, round(y, 6)] for x, y in samples],
        "back_to_back_bytes_per_s": stream_rate, "alone_intercept_s": intercept,
        "small_alone_s": small_alone, "small_service_s": small_service,
    }
    follows = pressed = in_reply = False
    efficiency = 1.0
    duplex = True
    if stages == 2:
        behind = raw["behind"]
        behind_s = _median(behind["flight_s"], "small op before a large one")
        big_push = cost + behind["big_link_bytes"] / rate
        extra = behind_s - small_alone
        follows = extra > FOLLOW_SHARE * big_push
        # The large push at the worker's own pace (its link alone) and at the server's (its ingress
        # shared by the pushes of ``link_factor`` workers): a small op's pull request queued behind
        # it waits for the slower one where the worker's queue drains only as the server takes it.
        factor = float(raw.get("link_factor") or link_factor(backend, workers, servers))
        worker_push = cost + behind["big_link_bytes"] / factor / rate
        pressed = follows and factor > 1 and extra > (worker_push + big_push) / 2
        derived.update(behind_s=behind_s, behind_extra_s=extra, big_push_s=big_push,
                       big_push_worker_s=worker_push)
        staggered = raw.get("staggered")
        if staggered:
            one_way = staggered["link_bytes"] / rate
            pair = _median(staggered["flight_s"], "two staggered large ops")
            transfers = (pair - startup - 2 * stages * cost) / one_way
            duplex = transfers < DUPLEX_TRANSFERS
            if duplex:  # the 0.75 transfers both directions were busy took longer by the excess
                efficiency = 1.0 / (1.0 + max(0.0, transfers - DUPLEX_IDEAL) / STAGGER_OVERLAP)
                efficiency = min(1.0, max(0.5, efficiency))
            derived.update(staggered_s=pair, staggered_transfers=transfers)
        else:
            derived["duplex_assumed"] = True
    elif nominal_bytes_per_s:
        duplex = rate >= DUPLEX_SHARE * nominal_bytes_per_s
    else:
        derived["duplex_assumed"] = True  # unshaped loopback: nothing to tell it from

    # Long streams, replayed by the simulator's network. All-reduce: the rate from the largest
    # back-to-back groups, one collective after another (ops alone read gloo's link fast: a small
    # op's noise tilts the line, and the token bucket lets a little through early). A parameter
    # server's groups overlap pushes and pulls in ways the model does not, so its rate stays the ops
    # alone one. What both directions busy at once cost comes from streams that keep them so for most
    # of their time, as training does (the staggered pair overlaps them for 0.75 transfers only):
    # BytePS's windowed push_pull streams, with the largest back-to-back groups (plain push and pull).
    link = EngineTraits(name=backend, stages=stages, pulls_follow_pushes=follows, message_cost_s=cost,
                        startup_latency_s=startup, duplex=bool(duplex), servers=servers if stages == 2 else 0,
                        backpressure=bool(pressed), duplex_efficiency=efficiency)
    try:
        largest = max((int(g["size_index"]) for g in stream), default=None)
        windowed = (raw.get("windowed") or []) if stages == 2 and duplex else []
        streams = streams_of(link, [g for g in stream if int(g["size_index"]) == largest] + list(windowed))
        derived["alone_bytes_per_s"] = rate
        rate, efficiency, derived["sustained"] = replay_fit(streams, workers, rate, efficiency, fit_rate=stages == 1,
                                                            fit_efficiency=bool(windowed))
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"calibration: the probe output's sustained streams are malformed ({err!r}); valid: "
                          f"the 'stream' and 'windowed' phases of byteps_prophet.calibrate.probe") from None
    if windowed:
        derived["windowed_efficiency"] = efficiency
    if stages == 2:
        replies = raw.get("replies")
        if replies:  # the transport the scheduled KVStore uses: one pushpull per atom
            try:
                in_reply, efficiency = _replies(replies, derived, link.replace(pull_in_reply=True), workers,
                                                small_alone=small_alone, big_push=big_push, rate=rate,
                                                efficiency=efficiency)
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise ConfigError(f"calibration: the probe output's 'replies' is malformed ({err!r}); valid: "
                                  f"the pushpull phase of byteps_prophet.calibrate.probe") from None
    if nominal_bytes_per_s:
        derived["rate_share_of_nominal"] = rate / nominal_bytes_per_s

    compute = raw.get("compute") or {}
    slowdown = _slowdown(compute, "alone_s", "busy_s", derived, "compute")
    if slowdown is None:
        derived["compute_missing"] = True
    # the same bytes moved beside the workload, over moved alone
    comm_slowdown = _slowdown(compute, "mover_alone_s", "mover_busy_s", derived, "mover", "comm_ratio")

    if atom_elements is None:
        atom_elements = 0 if backend == "gloo" else DEFAULT_ATOM_ELEMENTS
    traits = EngineTraits(
        name=backend, stages=stages, pulls_follow_pushes=follows, message_cost_s=_round(cost),
        startup_latency_s=_round(startup), atom_elements=int(atom_elements), duplex=bool(duplex),
        servers=servers if stages == 2 else 0, compute_slowdown=round(slowdown or 1.0, 4),
        comm_slowdown=round(comm_slowdown or 1.0, 4),
        bandwidth_bytes_per_s=round(rate, 1), backpressure=bool(pressed),
        duplex_efficiency=round(efficiency, 4), pull_in_reply=bool(in_reply),
    )
    return traits, derived


def _replies(replies: Mapping[str, Any], derived: dict, link: EngineTraits, workers: int, *, small_alone: float,
             big_push: float, rate: float, efficiency: float) -> tuple[bool, float]:
    """``(pull_in_reply, duplex_efficiency)`` from the probe's ``pushpull`` phase (module docstring):
    the efficiency with which the simulator's network, the pull in the reply, finishes its bursts and
    windowed streams (``replay_fit``)."""
    behind_s = _median(replies.get("behind_s") or [], "small pushpull before a large one")
    extra = behind_s - small_alone
    in_reply = extra < FOLLOW_SHARE * big_push
    derived.update(reply_behind_s=behind_s, reply_behind_extra_s=extra)
    streams = streams_of(link, list(replies.get("stream") or []) + list(replies.get("windowed") or []))
    if in_reply and link.duplex and streams:
        _, efficiency, derived["reply_streams"] = replay_fit(streams, workers, rate, efficiency)
        derived["reply_efficiency"] = efficiency
    return in_reply, efficiency


def _slowdown(compute: Mapping[str, Any], alone_key: str, busy_key: str, derived: dict, name: str,
              ratio_key: str | None = None) -> float | None:
    """Median of ``compute[busy_key]`` over median of ``compute[alone_key]``, clamped to [1, 10) (the
    traits' range), the medians and the unclamped ratio recorded in ``derived`` (``<name>_alone_s``,
    ``<name>_busy_s``, ``ratio_key`` or ``<name>_ratio``); None without both."""
    alone, busy = compute.get(alone_key) or [], compute.get(busy_key) or []
    if not (alone and busy):
        return None
    ratio = statistics.median(busy) / statistics.median(alone)
    derived.update({f"{name}_alone_s": statistics.median(alone), f"{name}_busy_s": statistics.median(busy),
                    ratio_key or f"{name}_ratio": ratio})
    return min(max(ratio, 1.0), 9.99)


def traits_from_repeats(raws: Sequence[Mapping[str, Any]], *, nominal_bytes_per_s: float | None = None
                        ) -> tuple[EngineTraits, dict[str, Any]]:
    """One engine from several calibrations of it (``calibrate --repeat N``): each fitted on its own
    (``traits_from``), then every measured number their median and every yes/no what most of them
    read (a tie reads no). One calibration's duplex efficiency or per-message cost moves by about
    the replay's 5% target (docs/ENGINE.md, "How steady a calibration is"). ``derived``: each
    calibration's traits and derived figures, in order."""
    if not raws:
        raise ConfigError("calibration: no probe outputs to fit")
    fitted = [traits_from(raw, nominal_bytes_per_s=nominal_bytes_per_s) for raw in raws]
    each = [traits.to_dict() for traits, _ in fitted]
    merged = {}
    for name, first in each[0].items():
        values = [t[name] for t in each]
        if isinstance(first, bool):
            merged[name] = sum(values) * 2 > len(values)
        elif isinstance(first, float):
            merged[name] = _round(statistics.median(values))
        elif len(set(values)) > 1:
            raise ConfigError(f"calibration: the repeats disagree on {name} ({', '.join(map(str, values))}); "
                              f"valid: repeats of one backend on one cluster")
        else:
            merged[name] = first
    return EngineTraits.from_dict(merged, "the repeats' median"), {"repeats": [
        {"traits": t, "derived": derived} for t, (_, derived) in zip(each, fitted)]}


def repeat_spread(derived: Mapping[str, Any]) -> list[str]:
    """``name min-max`` of every measured number that differs between the repeats (for the table)."""
    each = [r["traits"] for r in derived.get("repeats", [])]
    lines = []
    for name, first in (each[0].items() if each else ()):
        values = [t[name] for t in each]
        if isinstance(first, float) and len(set(values)) > 1:  # a bool is no float
            lines.append(f"{name} {min(values):.4g}-{max(values):.4g}")
    return lines


def _round(value: float) -> float:
    return float(f"{value:.6g}") if math.isfinite(value) else value


def format_table(traits: EngineTraits, derived: Mapping[str, Any], nominal_bytes_per_s: float | None) -> str:
    rate = traits.bandwidth_bytes_per_s
    nominal = (f" ({rate / nominal_bytes_per_s:.0%} of the shaped {nominal_bytes_per_s * 8 / 1e6:g} Mbit/s)"
               if nominal_bytes_per_s else " (unshaped)")
    rows = [
        ("link rate", f"{rate / 1e6:.2f} MB/s = {rate * 8 / 1e6:.1f} Mbit/s{nominal}"),
        ("per-message cost", f"{traits.message_cost_s * 1e3:.3f} ms"),
        ("start-up latency", f"{traits.startup_latency_s * 1e3:.3f} ms"),
        ("stages", f"{traits.stages} ({'push then pull' if traits.stages == 2 else 'all-reduce'})"),
        ("pulls follow pushes", "yes" if traits.pulls_follow_pushes else "no"),
        ("back-pressure", "yes (pushes leave at the server's pace)" if traits.backpressure else "no"),
        ("pull in reply", "yes (the push's answer carries the values: no pull request)" if traits.pull_in_reply else "no"),
        ("duplex efficiency", f"{traits.duplex_efficiency:.3f} (each direction's share while both are busy)"),
        ("duplex", ("yes" if traits.duplex else "no") + (" (assumed: unshaped)" if derived.get("duplex_assumed") else "")),
        ("servers", str(traits.servers) if traits.servers else "0 (no servers / as many as workers)"),
        ("compute slowdown", f"{traits.compute_slowdown:.3f}x"),
        ("atom elements", str(traits.atom_elements)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join([f"engine {traits.name}"] + [f"  {name:<{width}}  {value}" for name, value in rows])
