"""The calibration's fitting and profile writing, on synthetic probe outputs of a known engine."""
import json
import subprocess
import sys

import pytest

from byteps_prophet.calibrate.fit import fit_link, link_factor, repeat_spread, service_samples, traits_from, traits_from_repeats
from byteps_prophet.core.traits import SCHEMA, EngineTraits, load_engine, save_engine
from byteps_prophet.sim.replay import stream_done_s
from byteps_prophet.errors import ConfigError

RATE = 25e6  # bytes/s
COST = 0.002  # s per message
LATENCY = 0.010  # s an op waits on an idle link before its bytes move


def group(link_bytes, count, *, pairs=False, start=0.0, shared=1, size_index=0, factor=2):
    """Back-to-back ops of one size on a FIFO link: all issued at once, completing one service apart
    (``pairs``: two at a time, as gloo runs two collectives at once: same mean, alternating gaps)."""
    service = (COST + link_bytes / RATE) * shared  # shared=2: push and pull take turns on the link
    issued = [start + 1e-5 * i for i in range(count)]
    done = [start + LATENCY + service * (i + 1) for i in range(count)]
    if pairs:
        done = [start + LATENCY + service * (i + 1 + (0.8 if i % 2 == 0 else 0)) for i in range(count)]
    return {"size_index": size_index, "link_bytes": link_bytes, "tensor_bytes": link_bytes / factor,
            "issued": issued, "done": done}


def engine_of(backend, *, follows=True, duplex=True, backpressure=True, efficiency=1.0):
    """The traits a probe output of ``raw_output``'s arguments describes (the model the fit inverts)."""
    stages = 1 if backend == "gloo" else 2
    return EngineTraits(name=backend, stages=stages, pulls_follow_pushes=follows and stages == 2,
                        message_cost_s=COST, startup_latency_s=LATENCY, duplex=duplex,
                        servers=1 if stages == 2 else 0, backpressure=backpressure and follows and stages == 2,
                        duplex_efficiency=efficiency)


def simulated(traits, tensor_bytes, ops, window=None, start=0.0, size_index=4):
    """A stream as the simulator's network runs it on the engine ``traits``, at RATE with 2 workers: a
    back-to-back group, or with ``window`` a windowed one."""
    done = stream_done_s(traits, RATE, 2, int(tensor_bytes), ops, window or ops)
    factor = link_factor(traits.name, 2, traits.servers)
    out = {"size_index": size_index, "link_bytes": tensor_bytes * factor, "tensor_bytes": int(tensor_bytes),
           "issued": [start] * ops, "done": [start + t for t in sorted(done)]}
    return {**out, "window": window} if window else out


def raw_output(backend="byteps", *, follows=True, duplex=True, slowdown=1.25, pairs=False, backpressure=True,
               transfers=3.25, comm_slowdown=1.2):
    stages = 1 if backend == "gloo" else 2
    factor = link_factor(backend, 2, 1 if stages == 2 else 0)
    sizes = [32_768, 131_072, 524_288, 2_097_152, 4_194_304]
    engine = engine_of(backend, follows=follows, duplex=duplex, backpressure=backpressure,
                       efficiency=1 / (1 + max(0.0, transfers - 3.25) / 0.75) if duplex else 1.0)
    # the largest size's groups as the simulator runs them (they decide the rate the engine sustains)
    stream = [group(x, 6, pairs=pairs, start=10.0 * k, shared=1 if duplex else 2, size_index=k % 5, factor=factor)
              if k % 5 < 4 else simulated(engine, x / factor, 6, start=10.0 * k)
              for k, x in enumerate(sizes * 2)]
    one = lambda x: COST + x / RATE  # noqa: E731
    alone = lambda x, reps: {"link_bytes": x, "flight_s": [LATENCY + stages * one(x)] * reps}  # noqa: E731
    small_alone = LATENCY + stages * one(sizes[0])
    out = {"backend": backend, "workers": 2, "servers": 1 if stages == 2 else 0, "stream": stream,
           "alone": {"small": alone(sizes[0], 6), "mid": alone(sizes[-2], 3), "big": alone(sizes[-1], 3)},
           "compute": {"alone_s": [0.020, 0.021, 0.019], "busy_s": [0.020 * slowdown] * 5,
                       "mover_alone_s": [0.50, 0.52, 0.49], "mover_busy_s": [0.50 * comm_slowdown] * 3}}
    if stages == 2:  # the second large op's push overlaps the first's pull on a duplex link
        pair = LATENCY + 2 * stages * COST + (transfers if duplex else 4) * sizes[-1] / RATE
        out["staggered"] = {"link_bytes": sizes[-1], "flight_s": [pair] * 3}
    if stages == 2:
        # the large push at the server's pace (its link carries both workers' pushes: link bytes), or,
        # without back-pressure, at the worker's own (half of them)
        wait = (one(sizes[-1]) if backpressure else one(sizes[-1] / 2)) if follows else 0.0
        out["behind"] = {"big_link_bytes": sizes[-1], "flight_s": [small_alone + wait] * 3}
    return out


def test_link_factor_counts_what_the_busiest_link_carries():
    assert link_factor("gloo", 2, 0) == 1.0  # ring: 2(n-1)/n of the tensor over every link
    assert link_factor("gloo", 4, 0) == 1.5
    assert link_factor("byteps", 2, 1) == 2.0  # one server's link: every worker's push
    assert link_factor("kvstore", 4, 2) == 2.0
    assert link_factor("byteps", 2, 4) == 1.0  # never less than the worker's own link


def test_fit_recovers_cost_and_rate_from_back_to_back_groups():
    cost, rate = fit_link(service_samples(raw_output()["stream"]))
    assert cost == pytest.approx(COST, rel=1e-6)
    assert rate == pytest.approx(RATE, rel=1e-6)


def test_paired_completions_give_the_mean_service_not_the_short_gaps():
    samples = service_samples(raw_output("gloo", pairs=True)["stream"])
    _, rate = fit_link(samples)
    assert rate == pytest.approx(RATE, rel=0.15)  # the median gap alone read 5x the rate here


def test_an_op_issued_after_the_previous_completed_is_no_service_sample():
    g = {"link_bytes": 1e6, "issued": [0.0, 0.5, 0.6], "done": [0.2, 0.7, 0.8]}  # op 1 found the link idle
    assert service_samples([g]) == []


def test_sizes_that_do_not_spread_give_a_line_through_the_origin():
    cost, rate = fit_link([(1e6, 0.04)] * 10)
    assert cost == 0.0 and rate == pytest.approx(25e6)
    with pytest.raises(ConfigError, match="no back-to-back"):
        fit_link([])


def test_traits_of_a_parameter_server_whose_pulls_follow_pushes():
    traits, derived = traits_from(raw_output("byteps"), nominal_bytes_per_s=RATE)
    assert traits.stages == 2 and traits.pulls_follow_pushes and traits.duplex
    assert traits.message_cost_s == pytest.approx(COST, rel=1e-3)
    assert traits.bandwidth_bytes_per_s == pytest.approx(RATE, rel=1e-3)
    assert traits.startup_latency_s == pytest.approx(LATENCY, rel=1e-3)
    assert traits.compute_slowdown == pytest.approx(1.25, rel=1e-3)
    assert traits.servers == 1 and traits.atom_elements == 250_000
    assert derived["staggered_transfers"] == pytest.approx(3.25, rel=1e-3)


def test_back_pressure_is_a_wait_for_the_server_not_for_the_worker_link():
    """The small op's pull request behind the large push: at the server's pace (both workers' pushes
    through its ingress) it is back-pressure; at the worker's own pace, not; the other traits agree."""
    pressed, derived = traits_from(raw_output("byteps"), nominal_bytes_per_s=RATE)
    assert pressed.backpressure and pressed.pulls_follow_pushes
    assert derived["big_push_worker_s"] == pytest.approx(COST + (derived["big_push_s"] - COST) / 2, rel=1e-6)
    free, _ = traits_from(raw_output("byteps", backpressure=False), nominal_bytes_per_s=RATE)
    assert not free.backpressure and free.pulls_follow_pushes
    assert free.replace(backpressure=True) == pressed
    one_server_each = dict(raw_output("byteps"), servers=2)  # no shared ingress: nothing to tell
    assert not traits_from(one_server_each, nominal_bytes_per_s=RATE)[0].backpressure
    assert not traits_from(raw_output("kvstore", follows=False), nominal_bytes_per_s=RATE)[0].backpressure


def test_duplex_efficiency_is_what_the_overlap_cost_beyond_3_25_transfers():
    """Two staggered large ops done after 3.25 transfers: both directions ran at full rate at once;
    after 3.31 (BytePS at 200 Mbit/s), the 0.75 transfers of overlap took 8% longer: 0.926; a
    half-duplex link (4 transfers) has no efficiency to speak of (1)."""
    assert traits_from(raw_output("byteps"), nominal_bytes_per_s=RATE)[0].duplex_efficiency == 1.0
    slowed, derived = traits_from(raw_output("byteps", transfers=3.31), nominal_bytes_per_s=RATE)
    assert slowed.duplex and slowed.duplex_efficiency == pytest.approx(1 / (1 + 0.06 / 0.75), abs=1e-4)
    half = traits_from(raw_output("byteps", duplex=False), nominal_bytes_per_s=RATE)[0]
    assert not half.duplex and half.duplex_efficiency == 1.0


def test_refit_writes_the_traits_again_from_the_raw_timings(tmp_path):
    """`calibrate --refit`: an engine profile from before a trait existed gets it from its own raw
    timings, the other traits unchanged; a profile without raw timings is one line, exit 2."""
    traits, derived = traits_from(raw_output("byteps"), nominal_bytes_per_s=RATE)
    old = tmp_path / "old.json"
    doc = {"schema": SCHEMA, "traits": {k: v for k, v in traits.to_dict().items()
                                        if k not in ("backpressure", "duplex_efficiency")},
           "measured": {"setup": {"nominal_bytes_per_s": RATE}, "raw": raw_output("byteps"), "commit": "abc"}}
    old.write_text(json.dumps(doc))
    assert not load_engine(str(old)).backpressure  # an older file loads: the trait's default
    new = tmp_path / "new.json"
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "calibrate", "--refit", str(old), "--out",
                           str(new), "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert load_engine(str(new)) == traits and json.loads(new.read_text())["measured"]["commit"] == "abc"
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"schema": SCHEMA, "traits": {}}))
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "calibrate", "--refit", str(bare)],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "measured.raw" in lines[0], proc.stderr


def test_pulls_that_do_not_wait_and_a_half_duplex_link_are_told_apart():
    traits, derived = traits_from(raw_output("kvstore", follows=False, duplex=False), nominal_bytes_per_s=RATE)
    assert not traits.pulls_follow_pushes
    assert not traits.duplex and derived["staggered_transfers"] > 3.6
    assert traits.bandwidth_bytes_per_s == pytest.approx(RATE, rel=1e-3)  # ops alone: the link's own rate


def test_bunched_back_to_back_completions_do_not_inflate_the_rate():
    raw = raw_output("byteps")
    for g in raw["stream"]:  # a burst of pushes interleaved: everything completes at the end, in a bunch
        g["done"] = [g["done"][-1] * 2 - 1e-4 * (len(g["done"]) - i) for i in range(len(g["done"]))]
    traits, derived = traits_from(raw, nominal_bytes_per_s=RATE)
    assert derived["back_to_back_bytes_per_s"] > 5 * RATE  # what completion gaps alone would have said
    assert traits.bandwidth_bytes_per_s == pytest.approx(RATE, rel=1e-3)


def test_gloo_is_one_stage_no_servers_no_atoms_and_never_faster_computing():
    traits, derived = traits_from(raw_output("gloo", slowdown=0.8), nominal_bytes_per_s=RATE)
    assert traits.stages == 1 and not traits.pulls_follow_pushes
    assert traits.servers == 0 and traits.atom_elements == 0
    assert traits.compute_slowdown == 1.0 and derived["compute_ratio"] == pytest.approx(0.8)
    assert traits.duplex  # the measured rate is the shaped one
    slow, _ = traits_from(raw_output("gloo"), nominal_bytes_per_s=RATE * 3)
    assert not slow.duplex  # a third of the shaped rate: both directions share it


@pytest.mark.parametrize("broken, message", [
    ({"backend": "nccl"}, "backend 'nccl' is unknown"),
    ({"stream": None}, "lacks"),
])
def test_a_malformed_probe_output_is_a_one_line_error(broken, message):
    raw = raw_output()
    raw.update(broken)
    if raw["stream"] is None:
        del raw["stream"]
    with pytest.raises(ConfigError, match=message):
        traits_from(raw)


def test_the_profile_written_loads_back_with_its_raw_samples(tmp_path):
    raw = raw_output("byteps")
    traits, derived = traits_from(raw, nominal_bytes_per_s=RATE)
    path = tmp_path / "engine.json"
    save_engine(str(path), traits, {"setup": {"backend": "byteps"}, "derived": derived, "raw": raw})
    assert load_engine(str(path)) == traits
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA and doc["measured"]["raw"]["stream"][0]["done"]


def test_a_malformed_engine_profile_is_refused_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": SCHEMA, "traits": {"stages": 3}}))
    with pytest.raises(ConfigError, match="stages"):
        load_engine(str(path))


def test_cli_misuse_exits_2_with_one_line(tmp_path):
    for argv, culprit in ((["--backend", "nccl"], "byteps, kvstore, gloo"),
                          (["--backend", "gloo", "--workers", "1"], "--workers 1"),
                          (["--backend", "gloo", "--bandwidth", "fast"], "fast"),
                          (["--backend", "gloo", "--repeat", "0"], "--repeat 0"),
                          (["--backend", "gloo", "--out", str(tmp_path / "no" / "x.json")], "--out")):
        proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "calibrate", *argv],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and culprit in lines[0], proc.stderr


def replies(raw, *, in_reply=True, efficiency=0.85, ops=6):
    """The probe's pushpull phase of the engine ``raw`` describes: the small op before a large one
    waits only its own round trip (``in_reply``) or the large push too; bursts of ``ops`` large ops
    and windowed streams done when the simulator's network at ``efficiency``, the pull in the reply,
    finishes them."""
    big = raw["alone"]["big"]["link_bytes"]
    small = raw["alone"]["small"]["flight_s"][0]
    push = COST + big / RATE
    engine = engine_of("kvstore", efficiency=efficiency).replace(pull_in_reply=True)
    stream = [simulated(engine, big / 2, ops, start=20.0 * k) for k in range(3)]
    windowed = [simulated(engine, big / 2, 12, window=w, start=80.0 + 20 * w) for w in (2, 4)]
    return {"behind_s": [small + (0 if in_reply else push)] * 3, "big_alone_s": [LATENCY + 2 * push] * 3,
            "stream": stream, "windowed": windowed}


def test_a_pull_in_the_reply_is_a_small_op_not_waiting_for_the_large_push():
    """With pushpull the small op before a large one answered after its own round trip: pull in reply;
    waiting the large push as its push + pull did: not. The duplex efficiency then comes from the
    pushpull bursts (0.85 here), not from the staggered push/pull pair (3.25 transfers: 1)."""
    raw = raw_output("kvstore")
    raw["replies"] = replies(raw)
    traits, derived = traits_from(raw, nominal_bytes_per_s=RATE)
    assert traits.pull_in_reply and traits.pulls_follow_pushes  # the schedulers' rule stays as measured
    assert traits.duplex_efficiency == pytest.approx(0.85, abs=2e-3)
    assert [sim for *_, sim in derived["reply_streams"]] == pytest.approx(
        [took for *_, took, _ in derived["reply_streams"]], rel=2e-3)
    raw["replies"] = replies(raw, in_reply=False)
    traits, derived = traits_from(raw, nominal_bytes_per_s=RATE)
    assert not traits.pull_in_reply and traits.duplex_efficiency == 1.0
    assert not traits_from(raw_output("kvstore"), nominal_bytes_per_s=RATE)[0].pull_in_reply  # no phase: old
    raw["replies"] = {"behind_s": [0.1], "stream": [{"issued": [0.0], "done": [0.1, 0.2]}]}  # no size
    with pytest.raises(ConfigError, match="'replies' is malformed"):
        traits_from(raw, nominal_bytes_per_s=RATE)


def test_the_largest_bursts_are_replayed_for_the_record():
    """Without windowed streams (gloo, an older probe output) the largest back-to-back groups are only
    replayed: the simulator at the fitted traits finishes them when they finished, the efficiency is the
    staggered pair's."""
    traits, derived = traits_from(raw_output("byteps"), nominal_bytes_per_s=RATE)
    assert [window for window, *_ in derived["sustained"]] == [6, 6] and "windowed_efficiency" not in derived
    assert [sim for *_, sim in derived["sustained"]] == pytest.approx([took for *_, took, _ in derived["sustained"]],
                                                                      rel=1e-3)
    assert traits.duplex_efficiency == 1.0


def test_windowed_streams_give_what_both_directions_busy_at_once_cost():
    """push_pull streams with 3 or 6 ops in flight overlap pushes and pulls as Prophet's do: the
    efficiency is the one the simulator's network finishes them with (0.88 here), at the rate of the
    ops alone; the staggered pair (3.25 transfers: 1) no longer decides it. A stream without its
    size is one line."""
    engine = engine_of("byteps", efficiency=0.88)
    raw = raw_output("byteps")
    raw["windowed"] = [simulated(engine, 1_048_576, 18, window=w, size_index=3) for w in (3, 6, 3, 6)]
    traits, derived = traits_from(raw, nominal_bytes_per_s=RATE)
    assert traits.duplex_efficiency == pytest.approx(0.88, abs=0.002)
    assert traits.bandwidth_bytes_per_s == pytest.approx(RATE, rel=2e-3)
    assert derived["windowed_efficiency"] == traits.duplex_efficiency
    assert traits_from(raw_output("byteps"), nominal_bytes_per_s=RATE)[0].duplex_efficiency == 1.0
    del raw["windowed"][0]["tensor_bytes"]
    with pytest.raises(ConfigError, match="sustained streams are malformed"):
        traits_from(raw, nominal_bytes_per_s=RATE)


def test_comm_slowdown_is_the_bytes_moved_beside_the_workload_over_alone():
    """The compute phase moves the same bytes alone and beside the workload: 1.2x as long beside it
    (gloo's reductions and the engines' threads share the cores); never below 1; an older probe output
    without the mover's timings reads 1."""
    traits, derived = traits_from(raw_output("gloo"), nominal_bytes_per_s=RATE)
    assert traits.comm_slowdown == pytest.approx(1.2) and derived["comm_ratio"] == pytest.approx(1.2)
    assert traits_from(raw_output("gloo", comm_slowdown=0.9), nominal_bytes_per_s=RATE)[0].comm_slowdown == 1.0
    raw = raw_output("byteps")
    del raw["compute"]["mover_busy_s"]
    assert traits_from(raw, nominal_bytes_per_s=RATE)[0].comm_slowdown == 1.0


def test_repeats_give_each_numbers_median_and_what_most_read(tmp_path):
    """``calibrate --repeat 3``: three calibrations fitted on their own, then each measured number their
    median (duplex efficiency 1 / 0.926 / 0.96 -> 0.96) and each yes/no what two of three read; the
    file keeps every probe output (``measured.raws``) and ``--refit`` gives the same engine again."""
    raws = [raw_output("byteps"), raw_output("byteps", transfers=3.31, slowdown=1.5),
            raw_output("byteps", transfers=3.28125, backpressure=False)]
    each = [traits_from(raw, nominal_bytes_per_s=RATE)[0] for raw in raws]
    merged, derived = traits_from_repeats(raws, nominal_bytes_per_s=RATE)
    efficiencies = sorted(t.duplex_efficiency for t in each)
    assert merged.duplex_efficiency == efficiencies[1] and efficiencies[0] < efficiencies[1] < efficiencies[2]
    assert merged.compute_slowdown == pytest.approx(1.25)  # 1.25, 1.5, 1.25
    assert [t.backpressure for t in each] == [True, True, False] and merged.backpressure
    assert [r["traits"] for r in derived["repeats"]] == [t.to_dict() for t in each]
    assert any(line.startswith("duplex_efficiency ") for line in repeat_spread(derived))
    doc = {"schema": SCHEMA, "traits": merged.to_dict(),
           "measured": {"setup": {"nominal_bytes_per_s": RATE}, "raws": raws, "derived": derived}}
    path = tmp_path / "repeats.json"
    path.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "calibrate", "--refit", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "the median of 3 calibrations" in proc.stdout, proc.stderr
    assert load_engine(str(path)) == merged and len(json.loads(path.read_text())["measured"]["raws"]) == 3
    with pytest.raises(ConfigError, match="disagree on name"):
        traits_from_repeats([raw_output("byteps"), raw_output("gloo")], nominal_bytes_per_s=RATE)
