"""The scheduled MXNet KVStore.

Fast tests: atom grids, settings errors, the engine gate. Slow tests start a real ps-lite job
(scheduler, server, two workers) on 127.0.0.1 with a free port via ``byteps_prophet.cluster.loopback_mxnet``.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from byteps_prophet.core import Settings  # noqa: E402
from byteps_prophet.core.trace import events  # noqa: E402
from byteps_prophet.errors import ConfigError  # noqa: E402
from byteps_prophet.mxnet.gates import EngineGate, copy_raw  # noqa: E402
from byteps_prophet.mxnet import kvstore as skv  # noqa: E402
from byteps_prophet.mxnet.atoms import atom_elements, atom_ranges  # noqa: E402
from byteps_prophet.cluster.loopback_mxnet import run_local  # noqa: E402
from params_check import assert_every_parameter_trained, run_report  # noqa: E402
from trace_check import assert_plan_engaged  # noqa: E402

WORKER = str(Path(__file__).with_name("worker_train.py"))
PULL_THEN_PUSH = str(Path(__file__).with_name("worker_pull_then_push.py"))
SCHEDULERS = ("fifo", "bytescheduler", "prophet")


# -- fast ---------------------------------------------------------------------------------------------
def test_atoms_cover_rows_once_and_follow_the_scheduler():
    shape = (1000, 300)  # 300 k elements
    assert atom_ranges(shape, "fifo", 100_000, 25_000) == [(0, 1000)]
    bs = atom_ranges(shape, "bytescheduler", 100_000, 25_000)
    assert len(bs) == 3
    ph = atom_ranges(shape, "prophet", 100_000, 25_000)
    assert ph[:2] == [(0, 83), (83, 166)] and len(ph) == 13  # 83-row runs from row 0: Prophet's cut grid
    for grid in (bs, ph):
        assert grid[0][0] == 0 and grid[-1][1] == 1000
        assert all(a[1] == b[0] for a, b in zip(grid, grid[1:]))


def test_bench_model_list_matches():
    from byteps_prophet.ab import runner
    from byteps_prophet.ab.workloads import mxnet_bench as bench, mxnet_models as models
    assert bench.MODELS == models.MODELS
    assert runner.MXNET_SCALABLE == models.SCALABLE


def _parameter_count(name: str, width: float) -> int:
    from byteps_prophet.ab.workloads import mxnet_models as models
    net = models.build(name, width=width)
    net.initialize()
    net(mx.nd.zeros(models.input_shape(name, 1)))  # complete deferred shapes
    return sum(p.data().size for p in net.collect_params().values())


def test_width_scales_the_models_that_have_one():
    """--width 1.0 keeps the documented sizes; the dense layers scale as width squared."""
    from byteps_prophet.errors import UserError
    from byteps_prophet.ab.workloads import mxnet_models as models
    assert round(_parameter_count("vgg", 1.0) / 1e6, 1) == 59.6
    assert round(_parameter_count("transformer", 1.0) / 1e6, 1) == 12.7
    half = _parameter_count("transformer", 0.5) / _parameter_count("transformer", 1.0)
    assert 0.24 < half < 0.27
    assert _parameter_count("vgg", 0.5) < 0.27 * 59.6e6
    with pytest.raises(UserError, match="valid: --width 1.0, or --model vgg, transformer, mlp"):
        models.build("resnet18", width=0.5)


def test_atom_env_validated():
    s = Settings()
    assert atom_elements(s) == s.partition // 4
    assert atom_elements(s, per_partition=1) == s.partition  # BytePS-MXNet's default
    assert atom_elements(Settings.from_env({"BYTEPS_PROPHET_ATOM_ELEMENTS": "5000"})) == 5000
    with pytest.warns(FutureWarning, match="PROPHET_MXNET_ATOM_ELEMENTS is renamed BYTEPS_PROPHET_ATOM_ELEMENTS"):
        old = Settings.from_env({"PROPHET_MXNET_ATOM_ELEMENTS": "6000"})
    assert atom_elements(old) == 6000
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_ATOM_ELEMENTS='x' is not a number"):
        Settings.from_env({"BYTEPS_PROPHET_ATOM_ELEMENTS": "x"})


def test_leader_measures_the_link_like_the_torch_plugin(monkeypatch):
    """The scheduling worker's monitor is the LinkMonitor (start-up latency apart from the link's
    cost, read by Prophet's hold); BYTEPS_PROPHET_LINK=core gives the core's; a bad value is refused."""
    from byteps_prophet.core.link_monitor import LinkMonitor
    from byteps_prophet.core.bandwidth import BandwidthMonitor

    settings = Settings(scheduler="prophet")
    kv = skv.create("local", settings=settings)
    try:
        assert kv.leader and type(kv.scheduler.bandwidth) is LinkMonitor
        kv.init(3, mx.nd.ones((10, 4)))
        out = mx.nd.zeros((10, 4))
        kv.pushpull(3, mx.nd.ones((10, 4)) * 2, out=out)
        kv.flush(timeout=30)
        assert out.asnumpy().tolist() == [[2.0] * 4] * 10
    finally:
        kv.close()
    monkeypatch.setenv("BYTEPS_PROPHET_LINK", "core")
    kv = skv.create("local", settings=Settings.from_env().replace(scheduler="prophet"))
    assert type(kv.scheduler.bandwidth) is BandwidthMonitor
    kv.close()
    monkeypatch.setenv("BYTEPS_PROPHET_LINK", "bogus")
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_LINK='bogus' is invalid; valid: measured, core"):
        skv.create("local")


@pytest.mark.parametrize("variable", ["BYTEPS_PROPHET_TRACE", "PROPHET_MXNET_TIMELINE"])
def test_the_store_writes_the_one_trace_format(tmp_path, variable, perfetto_check):
    """The store's trace is the torch plugin's format (Perfetto's fields, metadata, one ready/done per
    gradient and step, atom spans); the old variable still works, with a warning; a path in a missing
    directory is refused at once, in one line."""
    path = tmp_path / "kv.json"
    with pytest.warns(FutureWarning) if variable.startswith("PROPHET_") else contextlib.nullcontext():
        settings = Settings.from_env({variable: str(path), "BYTEPS_SCHEDULER": "prophet"})
    kv = skv.create("local", settings=settings)
    try:
        kv.init(3, mx.nd.ones((10, 4)))
        for step in range(3):
            out = mx.nd.zeros((10, 4))
            kv.pushpull(3, mx.nd.ones((10, 4)) * step, out=out)
            kv.flush(timeout=30)
            assert out.asnumpy().tolist() == [[float(step)] * 4] * 10
    finally:
        kv.close()
    doc = perfetto_check(path)
    assert doc["metadata"]["scheduler"] == "prophet" and doc["metadata"]["tensors"] == [[0, "3", [10, 4], 160]]
    for kind in ("ready", "done"):
        assert sorted(e["args"]["iteration"] for e in events(doc, kind)) == [0, 1, 2], kind
    atoms = list(events(doc, "atom"))
    assert atoms and all(e["ph"] == "X" and e["dur"] >= 0 for e in atoms)
    assert {e["args"]["seq"] for e in atoms} == {1, 2, 3}
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_TRACE=.*missing.* does not exist"):
        skv.create("local", settings=settings.replace(trace=str(tmp_path / "missing" / "kv.json")))


def test_close_ends_a_synchronisation_that_never_finishes_in_bounded_time():
    """A transfer that never returns (a peer gone, a bug) makes ``close`` wait at most
    BYTEPS_PROPHET_TIMEOUT and then raise, its threads stopped, instead of hanging the worker (a CI
    run once hung in the forward-order test's ``close`` after its ``flush(timeout=60)`` had failed)."""
    kv = skv.create("local", settings=Settings(scheduler="fifo", timeout=1.0))
    stuck = threading.Event()
    kv._atoms.transfer = lambda atom_key, buf, priority: stuck.wait(120)
    kv.init(3, mx.nd.ones((10, 4)))
    kv.pushpull(3, mx.nd.ones((10, 4)), out=mx.nd.zeros((10, 4)))
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="did not finish in time"):
            kv.close()
        assert time.monotonic() - started < 30
        assert kv._probe.stopping
    finally:
        stuck.set()
    deadline = time.monotonic() + 10  # the transfer returned: its gate opens, no engine op left pending
    while kv._gate.open_gates and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kv._gate.open_gates == 0


def test_close_alone_waits_for_nothing_and_opens_the_gates():
    """``close(alone=True)`` (a process leaving on an error, ``close_all`` with ``sys.last_value``
    set): a transfer that never returns is not waited for, nothing is raised, the engine gates open
    without their results, and MXNet's store is abandoned, never freed (freeing meets the peers)."""
    kv = skv.create("local", settings=Settings(scheduler="fifo", timeout=30.0))
    stuck = threading.Event()
    kv._atoms.transfer = lambda atom_key, buf, priority: stuck.wait(120)
    kv.init(3, mx.nd.ones((10, 4)))
    out = mx.nd.zeros((10, 4))
    kv.pushpull(3, mx.nd.ones((10, 4)) * 2, out=out)
    real = kv._real
    started = time.monotonic()
    try:
        kv.close(alone=True)
        assert time.monotonic() - started < 10
        assert kv._probe.stopping and real.handle is None and isinstance(kv._real, skv._LeftStore)
        deadline = time.monotonic() + 10
        while kv._gate.open_gates and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kv._gate.open_gates == 0
        assert out.asnumpy().tolist() == [[0.0] * 4] * 10  # opened without the result
    finally:
        stuck.set()


@contextlib.contextmanager
def _trained_dense_stack(idle_close_s: float = skv.IDLE_CLOSE_S):
    """Three Trainer steps of a 12-layer dense stack on a local store under Prophet, flushed:
    ``(net, trainer, store)``, the store closed on leaving."""
    from mxnet import autograd, gluon
    from mxnet.gluon import nn

    mx.random.seed(7)
    net = nn.HybridSequential()
    for _ in range(11):
        net.add(nn.Dense(512, activation="relu"))
    net.add(nn.Dense(2))
    net.initialize(mx.init.Xavier())
    kv = skv.create("local", settings=Settings(scheduler="prophet", timeout=60), idle_close_s=idle_close_s)
    try:
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
        x, y = mx.nd.ones((256, 512)), mx.nd.zeros((256,))
        for _ in range(3):
            with autograd.record():
                loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
            loss.backward()
            trainer.step(256)
        kv.flush(timeout=60)
        yield net, trainer, kv
    finally:
        kv.close()


def _parameters(net) -> list:
    return [p.data().asnumpy() for p in net.collect_params().values()]


def test_a_step_closed_idle_mid_iteration_neither_deadlocks_nor_changes_the_math():
    """MXNet computes asynchronously: the loop registers the next iteration's first gradients while
    the engine still runs this one's backward. A pause of ``idle_close_s`` between two registrations
    (0.1 s by default: a GC pause or a busy machine) closed a step mid-iteration, the rest of the
    iteration joined the next iteration's first keys in one step, and the probe, waiting for those in
    backward order, waited for gradients whose forward waited for the rest: a clean-clone CI hung
    twice here, and with 0.3 ms 4 of 9 runs did. Now such a step ends where the iteration does."""
    with _trained_dense_stack() as (net, _, _):
        reference = _parameters(net)
    split = 0
    for _ in range(12):
        with _trained_dense_stack(0.0003) as (net, _, kv):
            params, split = _parameters(net), split + (kv._probe.iteration > 3)  # more steps than iterations
        for got, want in zip(params, reference):
            np.testing.assert_array_equal(got, want)
    assert split, "no iteration was split: the test did not exercise the continuation"


def test_the_store_learns_the_forward_order_from_the_backward():
    """MXNet's Trainer numbers its keys by sorted parameter name (dense10 before dense2); the store
    posts each gradient as the engine stages it and learns each key's place in the forward pass from
    that order (the first layers' gradients come last), the schedulers' priority."""
    with _trained_dense_stack() as (net, trainer, kv):
        place = {trainer._params[key].name: index for key, index in kv.forward_index.items()}
    assert len(place) == 24
    # each parameter's layer by position (Gluon's names count on across the tests of this process)
    layer = {param.name: i for i, block in enumerate(net) for param in block.collect_params().values()}
    first = [place[n] for n in place if layer[n] <= 2]
    last = [place[n] for n in place if layer[n] >= 9]
    assert max(first) < min(last), sorted(place, key=place.get)


def test_invalid_scheduler_is_one_line_error():
    env = dict(os.environ, BYTEPS_SCHEDULER="bogus")
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet.ab.workloads.mxnet_bench", "--steps", "1"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "BYTEPS_SCHEDULER='bogus'" in lines[0] and "prophet" in lines[0]


@pytest.mark.parametrize("env, args, needle", [
    ({"BYTEPS_SCHEDULER": "fifo"}, ["--tune-credit", "2"], "BYTEPS_SCHEDULER=bytescheduler"),
    ({"BYTEPS_SCHEDULER": "bytescheduler"}, ["--tune-credit", "2", "--tune-probes", "x"], "--tune-probes 'x'"),
    ({"BYTEPS_SCHEDULER": "bytescheduler"}, ["--tune-credit", "0"], "--tune-credit 0"),
])
def test_bench_tuning_arguments_are_checked_in_one_line(env, args, needle):
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet.ab.workloads.mxnet_bench", *args], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_bench_local_trains_alone_without_a_cluster():
    """--backend local (the A/B runner's compute_only limit): one JSON line, one worker's rate."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet.ab.workloads.mxnet_bench", "--backend", "local", "--model", "mlp",
                           "--steps", "2", "--warmup", "1", "--batch", "4", "--workers", "2"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == "local" and out["workers"] == 1 and out["samples_per_s"] > 0
    assert len(out["step_s"]) == 2 and out["param_bytes"] > 0
    assert 0 < out["cpu_s_per_step"] < 60  # the worker's CPU time per timed step, measured


def test_bench_help_documents_the_arguments():
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet.ab.workloads.mxnet_bench", "--help"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0
    for flag in ("--model", "--steps", "--batch", "--backend", "--warmup", "--json-out", "--tune-credit", "--tune-probes"):
        assert flag in proc.stdout


def test_gate_holds_readers_until_released_and_copies_under_it():
    gate = EngineGate()
    weight = mx.nd.ones((64, 64))
    staged = mx.nd.full((64, 64), 3.0)
    staged.wait_to_read()
    token = gate.hold([weight])
    doubled = weight * 2  # pushed after the gate: must see the released value
    threading.Timer(0.3, lambda: gate.release(token, lambda: copy_raw(staged, weight))).start()
    t0 = time.monotonic()
    assert float(doubled.sum().asscalar()) == 64 * 64 * 6
    assert time.monotonic() - t0 >= 0.25
    assert gate.open_gates == 0


def test_gate_released_before_it_starts():
    gate = EngineGate()
    w = mx.nd.zeros((4,))
    busy = mx.nd.random.uniform(shape=(800, 800))
    for _ in range(5):
        busy = mx.nd.dot(busy, busy) / 800
    w2 = w + busy[0, :4] * 0  # keeps w's var busy... via a reader
    token = gate.hold([w])
    src = mx.nd.full((4,), 7.0)
    src.wait_to_read()
    gate.release(token, lambda: copy_raw(src, w))
    assert w.asnumpy().tolist() == [7.0] * 4
    w2.wait_to_read()


# -- slow: real ps-lite jobs ---------------------------------------------------------------------------
def _train(tmp_path, tag, scheduler, **extra) -> tuple:
    out = tmp_path / f"{tag}.npz"
    env = {"BPP_OUT": str(out), "BPP_STEPS": "8", "BYTESCHEDULER_PARTITION": "5000",
           "BYTEPS_PROPHET_ATOM_ELEMENTS": "1000", "BYTESCHEDULER_CREDIT": "12000", **extra}
    if scheduler == "plain":
        env["BPP_PLAIN"] = "1"
    else:
        env["BYTEPS_SCHEDULER"] = scheduler
    result = run_local([sys.executable, WORKER], workers=2, servers=1, env=env, timeout=150)
    assert result.ok, f"{tag}: {run_report(result)}"
    values = dict(np.load(out))
    _assert_same(values, dict(np.load(tmp_path / f"{tag}.rank1.npz")), f"{tag}: worker 0 vs worker 1")
    if scheduler != "plain":  # close() freed MXNet's store: ps-lite is left before interpreter teardown
        left = [line for lines in result.output.values() for line in lines if "left ps-lite at close" in line]
        assert sorted(left) == [f"worker {r} left ps-lite at close: True" for r in (0, 1)], f"{tag}: {left}"
    return values, result


def _assert_same(a: dict, b: dict, what: str, tol=1e-6):
    assert a.keys() == b.keys(), what
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=tol, err_msg=f"{what}: {k}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_more_than_a_thousand_tensors(tmp_path):
    """1,106 tensors (1,100 of them 10 elements each) through the scheduled store: Prophet's parameters
    equal the unwrapped store's, and every one of the small tensors trained."""
    plain, _ = _train(tmp_path, "plain_many", "plain", BPP_MANY="1100", BPP_STEPS="3")
    prophet, _ = _train(tmp_path, "prophet_many", "prophet", BPP_MANY="1100", BPP_STEPS="3")
    assert len(prophet) == 1106
    _assert_same(plain, prophet, "plain vs prophet, 1,106 tensors")
    untrained = [k for k in prophet if "extra" in k and not np.any(prophet[k])]
    assert not untrained, f"{len(untrained)} of the 1,100 small tensors never moved, e.g. {untrained[:3]}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("on_kv", ["1", "0"])
def test_parameters_equal_under_all_schedulers(tmp_path, on_kv):
    """dist_sync + Gluon Trainer: K steps give the same parameters with FIFO, ByteScheduler, Prophet
    (partitions and Prophet's finer atoms exercised), and the same as the unwrapped store."""
    results = {s: _train(tmp_path, s, s, BPP_ON_KV=on_kv)[0] for s in ("plain", *SCHEDULERS)}
    for s in SCHEDULERS:
        _assert_same(results["plain"], results[s], f"plain vs {s}")
    assert_every_parameter_trained(results["plain"], dict(np.load(tmp_path / "plain.init.npz")), "plain")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_pull_reaches_the_server_before_the_next_push_of_its_key():
    """Gluon's first step with update_on_kvstore=False pulls the initial parameters after backward, then
    pushes the gradients. A dist_sync server without an optimizer stores the merged push, so a pull it
    serves later returns the gradient sum. With the pull held back in MXNet's engine the unwrapped
    store shows exactly that (the hold works); the scheduled store (Prophet atoms) must not."""
    got = {}
    for tag, env in (("plain", {"BPP_PLAIN": "1"}),
                     ("prophet", {"BYTEPS_SCHEDULER": "prophet", "BYTESCHEDULER_PARTITION": "1000"})):
        result = run_local([sys.executable, PULL_THEN_PUSH], workers=1, env=env, timeout=120)
        assert result.ok, f"{tag}: {run_report(result)}"
        got[tag] = [line for line in result.output["worker-0"] if line.startswith("RESULT")]
    assert got["plain"] == ["RESULT pulled=gradient grad=5.0"]  # stock MXNet 1.9: the hazard reproduced
    assert got["prophet"] == ["RESULT pulled=initial grad=5.0"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_unused_parameters_do_not_hang(tmp_path):
    """A grad_req='null' parameter and a block outside the graph: no hang, same values as FIFO."""
    fifo, _ = _train(tmp_path, "fifo", "fifo", BPP_UNUSED="1")
    prophet, result = _train(tmp_path, "prophet", "prophet", BPP_UNUSED="1")
    _assert_same(fifo, prophet, "fifo vs prophet")
    assert result.elapsed < 120


def _issues(path: Path, check) -> dict:
    """(gradient, synchronisation, atom) -> absolute time each was issued, from one worker's trace."""
    data = check(path)
    issued = {}
    for event in events(data, "atom"):
        name, atom, seq = event["name"].split(" atom ")[0], event["args"]["atom"], event["args"]["seq"]
        assert (name, seq, atom) not in issued, f"{path.name}: {name} atom {atom} issued twice"
        issued[name, seq, atom] = event["ts"]
    return issued


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_followers_issue_the_leaders_atoms_after_it(tmp_path, perfetto_check):
    """Worker 1 issues each atom only once worker 0 (the leader) has: the order channel. Under a
    one-partition credit the leader holds most atoms back; a follower that sent every gradient when
    ready (before the channel) issued most of them first. Values stay those of FIFO."""
    trace = tmp_path / "trace.json"
    values, _ = _train(tmp_path, "bs", "bytescheduler", BYTESCHEDULER_CREDIT="5000",
                       BYTEPS_PROPHET_TRACE=str(trace))
    (follower_path,) = tmp_path.glob("trace.rank*.json")
    leader, follower = _issues(trace, perfetto_check), _issues(follower_path, perfetto_check)
    assert leader.keys() == follower.keys()
    assert len(leader) > 50  # 8 steps of partitioned gradients
    # exactly once, every step: each gradient's atoms 0..n-1, each once (_issues refuses a second
    # issue), the same n in every step: no atom skipped or added in any step, on either worker
    atoms: dict = {}
    for name, seq, atom in leader:
        atoms.setdefault(name, {}).setdefault(seq, set()).add(atom)
    for name, per_step in atoms.items():
        counts = {seq: len(issued) for seq, issued in per_step.items()}
        assert len(set(counts.values())) == 1, f"{name}: atoms per step {counts}"
        assert all(issued == set(range(len(issued))) for issued in per_step.values()), (name, per_step)
    assert len({seq for per_step in atoms.values() for seq in per_step}) >= 8, "fewer steps than trained"
    early = [k for k in leader if follower[k] < leader[k]]
    assert not early, f"{len(early)} atoms issued by the follower before the leader, e.g. {early[:3]}"
    fifo, _ = _train(tmp_path, "fifo", "fifo")
    _assert_same(fifo, values, "fifo vs bytescheduler")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prophets_plan_engages_on_the_kvstore(tmp_path, perfetto_check):
    """Prophet's prediction, not the credit it falls back on, schedules steps on dist_sync (the leader's
    trace: planned_iterations and one plan event per planned step), and in every planned step its
    sends cut each gradient into pieces that cover every row once. Values stay those of FIFO."""
    trace = tmp_path / "prophet.trace.json"
    values, _ = _train(tmp_path, "prophet", "prophet", BYTEPS_PROPHET_TRACE=str(trace), BPP_STEPS="10")
    doc = perfetto_check(trace)
    assert doc["metadata"]["scheduler"] == "prophet" and doc["metadata"]["backend"] == "kvstore"
    plans = assert_plan_engaged(doc, 10, "KVStore", pieces="send")
    rows_of = {name: (shape[0] if shape else 1) for _, name, shape, _ in doc["metadata"]["tensors"]}
    ready = {(e["args"]["iteration"], e["name"]) for e in events(doc, "ready")}
    cut = 0
    for it in plans:
        sent: dict = {}
        for e in events(doc, "send"):
            if e["args"]["iteration"] == it:
                sent.setdefault(e["name"], []).append(tuple(e["args"]["rows"]))
        assert set(sent) == {name for i, name in ready if i == it}, (it, sorted(sent))
        for name, pieces in sent.items():
            pieces.sort()
            assert pieces[0][0] == 0 and pieces[-1][1] == rows_of[name], (it, name, pieces)
            assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), (it, name, pieces)
            cut += len(pieces) > 1
    assert cut, "no gradient cut into pieces in a planned step"
    fifo, _ = _train(tmp_path, "fifo", "fifo", BPP_STEPS="10")
    _assert_same(fifo, values, "fifo vs prophet")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_follower_that_stalls_mid_step_does_not_hang(tmp_path):
    """Worker 1 stalls right after its first gradient of a step, so its store closes the step there
    and the rest of that step's gradients wait for the next registration, which waits for the leader
    to send the first gradient, which the leader holds back until the follower's rest completes (a
    one-partition credit). The follower issues each announced atom once its gradient is staged, not
    when its step closes, so this ends, with FIFO's values. (It hung before: found in an A/B run.)"""
    values, _ = _train(tmp_path, "bs", "bytescheduler", BYTESCHEDULER_CREDIT="5000", BPP_STALL="3:1")
    fifo, _ = _train(tmp_path, "fifo", "fifo")
    _assert_same(fifo, values, "fifo vs bytescheduler")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dying", ["1", "0"])
def test_dead_worker_ends_the_run_naming_it(tmp_path, dying):
    """Worker 0 is the leader that announces the order; worker 1 follows it."""
    env = {"BYTEPS_SCHEDULER": "prophet", "BPP_STEPS": "50", "BPP_DIE_AT": f"3:{dying}"}
    t0 = time.monotonic()
    result = run_local([sys.executable, WORKER], workers=2, env=env, timeout=120)
    assert result.returncode == 3
    assert result.failed == f"worker-{dying}"
    assert any("dying at step 3" in line for line in result.output[result.failed])
    assert time.monotonic() - t0 < 100
    assert "exited with status 3" in result.reason


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("failing", ["1", "0"])
def test_a_worker_leaving_on_an_exception_ends_the_run_naming_it(tmp_path, failing):
    """A worker whose script raises leaves alone (``close_all``): it waits for nothing and meets no
    peer on its way out (it hung at exit before, in the barrier of MXNet's store), so it exits at
    once, while the others may be blocked on it, and the launcher names it. Its status is the error's
    (1), or SIGABRT's where ps-lite's threads, left running since the store is abandoned, abort at exit."""
    env = {"BYTEPS_SCHEDULER": "prophet", "BPP_STEPS": "50", "BPP_RAISE_AT": f"3:{failing}"}
    t0 = time.monotonic()
    result = run_local([sys.executable, WORKER], workers=2, env=env, timeout=120)
    assert result.failed == f"worker-{failing}", run_report(result)
    assert result.returncode in (1, 134), run_report(result)
    assert any("raising at step 3" in line for line in result.output[result.failed])
    assert time.monotonic() - t0 < 60, run_report(result)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_prints_one_json_line(tmp_path, perfetto_check):
    """... and, with BYTEPS_PROPHET_PROFILE, writes the profile of its timed steps from the store's trace
    (each gradient's ready time), the trace beside it."""
    import json

    from byteps_prophet.profile import load_profile
    profile = tmp_path / "p.json"
    result = run_local([sys.executable, "-m", "byteps_prophet.ab.workloads.mxnet_bench", "--model", "transformer",
                        "--steps", "3", "--warmup", "2", "--batch", "24"],
                       workers=2, env={"BYTEPS_SCHEDULER": "prophet", "BYTEPS_PROPHET_PROFILE": str(profile)},
                       timeout=240)
    assert result.ok, result.reason
    lines = [l for lines in result.output.values() for l in lines if l.startswith("{")]
    assert len(lines) == 1 and lines[0] in result.output["worker-0"]  # the leader: DMLC_WORKER_ID=0
    data = json.loads(lines[0])
    assert data["scheduler"] == "prophet" and data["framework"] == "mxnet" and len(data["step_s"]) == 3
    assert data["samples_per_s"] > 0
    assert data["profile"] == str(profile)
    recorded = load_profile(profile)
    assert len(recorded.iterations) == 3 and recorded.framework == "mxnet"
    # In forward order, as the backward staged them: the embedding among the first, the output layer
    # among the last, though MXNet's Trainer numbers the embedding after the blocks (by sorted name).
    # Gradients of one engine bulk are staged together, in no set order: hence "among".
    shapes = [list(t.shape) for t in recorded.tensors]
    assert shapes.index([512, 256]) < 12 and shapes.index([10, 512]) >= 30, shapes
    assert all(r is not None for r in recorded.iterations[-1].ready_s), recorded.iterations[-1].ready_s
    assert sum(recorded.iterations[-1].fwd_s) > 0  # a whole forward timed alone, spread over the tensors
    trace = perfetto_check(f"{profile}.trace.json")
    assert sum(1 for _ in events(trace, "ready")) == 5 * len(trace["metadata"]["tensors"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_comm_only_synchronises_over_the_real_store():
    """The A/B runner's comm_only reference: push/pull of the model's gradient shapes through dist_sync."""
    result = run_local([sys.executable, "-m", "byteps_prophet.ab.workloads.mxnet_bench", "--model", "mlp", "--comm-only",
                        "--steps", "3", "--warmup", "1", "--batch", "4"], workers=2, timeout=240)
    assert result.ok, result.reason
    lines = [l for lines in result.output.values() for l in lines if l.startswith("{")]
    assert len(lines) == 1 and lines[0] in result.output["worker-0"]
    data = json.loads(lines[0])
    assert data["comm_only"] and data["workers"] == 2 and data["param_bytes"] > 0 and data["samples_per_s"] > 0
