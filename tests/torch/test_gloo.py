"""Two worker processes on loopback, torch.distributed gloo: every worker's parameters equal to one
process on the averaged batch under every scheduler; every row sent exactly once on the leader and
the follower (traces); a dead worker ends the run, named."""
import json
import os
import sys

import pytest
import torch

from models_for_tests import build, data
from trace_check import assert_every_row_sent_once, assert_plan_engaged
from byteps_prophet.core import trace
from byteps_prophet.cluster.loopback_torch import run_workers

HERE = os.path.dirname(__file__)
WORKER = [sys.executable, os.path.join(HERE, "worker.py")]
# Prophet queues the same small partition as ByteScheduler (BYTEPS_PROPHET_PARTITION=0)
SLICING = {"BYTESCHEDULER_PARTITION": "64", "BYTEPS_PROPHET_PARTITION": "0", "PROPHET_MAX_CHUNK_BYTES": "256",
           "PROPHET_PROFILE_ITERATIONS": "2",
           "BYTEPS_PROPHET_TIMEOUT": "60"}


def reference(model_name, optname, steps, workers=2, bpps=1):
    """One process, one optimizer, the gradient of the mean loss over every worker's batch."""
    torch.manual_seed(0)
    model = build(model_name)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
           "adam": lambda p: torch.optim.Adam(p, lr=0.01),
           "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)}[optname](params)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(bpps):
            for rank in range(workers):
                x, y = data(model_name, rank, step, micro)
                (torch.nn.functional.mse_loss(model(x), y) / (bpps * workers)).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def launch(tmp_path, scheduler, optname, steps, model_name="mlp", extra=None, timeout=240):
    """The run and its outputs: ``<out>`` is worker 0's parameters, ``<out>.rank1`` worker 1's, and
    ``<out>.trace.json`` / ``<out>.trace.rank1.json`` their traces."""
    out = tmp_path / f"{scheduler}-{optname}-{model_name}.pt"
    env = dict(SLICING, BYTEPS_SCHEDULER=scheduler, BYTEPS_PROPHET_TRACE=f"{out}.trace.json", **(extra or {}))
    result = run_workers(WORKER + [str(out), str(steps), optname, model_name], 2, env=env, timeout=timeout)
    return result, out


def every_worker(out) -> list:
    return [torch.load(out), torch.load(f"{out}.rank1")]


def assert_sent_once(out, steps) -> list[int]:
    """Leader's and follower's traces: every row of every gradient sent once per step. Op counts."""
    return [assert_every_row_sent_once(json.loads(open(path).read()), steps, path)
            for path in (f"{out}.trace.json", f"{out}.trace.rank1.json")]


def assert_same(a, b, tol=1e-6):
    for k in a:
        assert torch.allclose(a[k], b[k], atol=tol, rtol=0), (k, (a[k] - b[k]).abs().max().item())


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("optname", ["sgd", "adam"])
def test_schedulers_equal_fifo_and_single_process(tmp_path, optname):
    steps = 5
    ref = reference("mlp", optname, steps)
    for scheduler in ("fifo", "bytescheduler", "prophet"):
        result, out = launch(tmp_path, scheduler, optname, steps)
        assert result.ok, (scheduler, result.reason, result.output)
        ops = assert_sent_once(out, steps)  # first: it names a duplicate or a gap where values only differ
        for params in every_worker(out):
            assert_same(params, ref)
        if scheduler != "fifo":  # 64-element partitions: the schedulers cut the mlp's gradients
            assert min(ops) > steps * len(ref), (scheduler, ops)
        if scheduler == "prophet":  # its prediction, not the credit it falls back on, sent steps 2-4
            trace = json.loads(open(f"{out}.trace.json").read())
            assert trace["metadata"]["planned_iterations"] >= steps - 2, trace["metadata"]["planned_iterations"]
            assert_plan_engaged(trace, steps, "torch/gloo")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_unused_frozen_and_accumulation_across_workers(tmp_path):
    ref = reference("unused", "adamw", 4, bpps=2)
    result, out = launch(tmp_path, "prophet", "adamw", 4, model_name="unused", extra={"BPPS": "2"})
    assert result.ok, (result.reason, result.output)
    for params in every_worker(out):
        assert_same(params, ref)
    assert_sent_once(out, 4)  # accumulation: one send per step, not per backward pass


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_many_tensors_across_workers(tmp_path):
    ref = reference("many", "sgd", 3)
    result, out = launch(tmp_path, "prophet", "sgd", 3, model_name="many")
    assert result.ok, (result.reason, result.output)
    for params in every_worker(out):
        assert_same(params, ref)
    assert_sent_once(out, 3)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dead_worker_ends_the_run_named(tmp_path):
    result, _ = launch(tmp_path, "prophet", "sgd", 50, extra={"DIE_AT_STEP": "3"}, timeout=200)
    assert not result.ok
    assert result.returncode != 124, "the run hung until the timeout"
    assert "worker-1" in result.reason and "SIGKILL" in result.reason, result.reason


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_comm_only_synchronises_the_model_without_compute():
    """The A/B runner's comm_only reference: real all-reduces of the model's gradient shapes, one JSON line."""
    import json

    from byteps_prophet.ab.workloads.torch_models import build as build_bench_model

    argv = [sys.executable, "-m", "byteps_prophet.ab.workloads.torch_bench", "--model", "mlp", "--comm-only", "--steps", "3",
            "--warmup", "1", "--batch", "4", "--backend", "gloo"]
    result = run_workers(argv, 2, env={"BYTEPS_PROPHET_TIMEOUT": "60"}, timeout=120)
    assert result.ok, result.reason
    line = [x for x in result.output["worker-0"] if x.startswith("{")][-1]
    out = json.loads(line)
    model_bytes = sum(p.numel() * 4 for p in build_bench_model("mlp").parameters())
    assert out["comm_only"] and out["world_size"] == 2 and out["param_bytes"] == model_bytes
    assert out["samples_per_s"] > 0 and out["iter_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_prophet_fused_collectives_equal_fifo_and_single_process(tmp_path):
    """With BYTEPS_PROPHET_FUSE=1 and no chunk cap Prophet fuses pieces into one all_reduce of a flat
    buffer on gloo (docs/DESIGN.md, "Fused collectives"): the parameters stay equal to one process's, every row goes
    once on both ranks, and a profiled step issues fewer collectives than it sends pieces (the members
    of a fused op share its issue time in the trace)."""
    steps = 5
    ref = reference("many", "sgd", steps)
    extra = {"PROPHET_MAX_CHUNK_BYTES": "0", "BYTESCHEDULER_PARTITION": "64", "BYTEPS_PROPHET_PARTITION": "0",
             "BYTEPS_PROPHET_FUSE": "1"}
    result, out = launch(tmp_path, "prophet", "sgd", steps, model_name="many", extra=extra)
    assert result.ok, (result.reason, result.output)
    for params in every_worker(out):
        assert_same(params, ref)
    assert_sent_once(out, steps)
    for path in (f"{out}.trace.json", f"{out}.trace.rank1.json"):
        ops = [e for e in trace.events(trace.load(path), "op") if e["args"]["iteration"] >= steps - 2]
        # (iteration, issue time): one per collective; the leader's spans start at submission
        issued = {(e["args"]["iteration"], e["args"]["issue_ts"] or e["ts"]) for e in ops}
        assert len(issued) < len(ops) / 2, (path, len(issued), len(ops))
