"""BytePS's PyTorch API used as a user's script uses it (synthetic data, nothing byteps_prophet in it),
one scenario per run (SCENARIO), each checked against the single-process reference it computes itself
from every rank's batches. Whether byteps_prophet schedules it is up to BYTEPS_SCHEDULER alone.

Every rank prints ``rank R scenario S sum X diff D`` (X: the parameters' sum as the script observes
them at the end; D: the largest relative difference from the reference over every point observed),
then leaves as the scenario says. Scenarios:

- ``observe``: parameters read directly after the loop, through ``state_dict()``/``torch.save`` of
  model and optimizer and loading them back, in an evaluation pass, and after ``bps.shutdown()``;
- ``accumulate``: ``backward_passes_per_step=2``, two half batches a step;
- ``fp16``: ``Compression.fp16``;
- ``broadcast``: ranks start apart (parameters, learning rate, momentum) and ``broadcast_parameters``
  and ``broadcast_optimizer_state`` make them rank 0's;
- ``clip``: ``synchronize()``, ``clip_grad_norm_``, then ``step()`` inside ``skip_synchronize()``;
- ``pushpull``: the user's own ``push_pull``, ``push_pull_async_inplace``, ``poll`` and
  ``synchronize`` between steps (the average loss);
- ``no_shutdown``: the script ends without ``bps.shutdown()``;
- ``raise``: rank 1 raises in the training loop; ``sigint``: rank 1 gets Ctrl-C (SIGINT) there.
"""
import io
import os
import signal
import sys

import torch

import byteps.torch as bps
from byteps.torch.ops import push_pull_async_inplace

SCENARIO = os.environ.get("SCENARIO", "observe")
STEPS = int(os.environ.get("USER_STEPS", "6"))
TOLERANCE = 1e-6
LR, MOMENTUM = 0.1, 0.9


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))


def batch(rank, step, part=0):
    gen = torch.Generator().manual_seed(10_000 * part + 100 * step + rank)
    return torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)


def loss_of(model, data):
    return torch.nn.functional.cross_entropy(model(data[0]), data[1])


def reference_gradients(model, step, size):
    """Each rank's gradient as that rank computes it, then the average BytePS must produce."""
    grads = []
    for r in range(size):
        model.zero_grad()
        parts = 2 if SCENARIO == "accumulate" else 1
        for part in range(parts):  # backward_passes_per_step accumulates locally
            loss_of(model, batch(r, step, part)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    if SCENARIO == "fp16":  # compressed before the push, summed and averaged in float16, cast back
        return [(sum(g[i].half() for g in grads) / size).float() for i in range(len(grads[0]))]
    return [sum(g[i] for g in grads) / size for i in range(len(grads[0]))]


def reference(size):
    """The parameters after every step, trained in one process."""
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    after = []
    for step in range(STEPS):
        averaged = reference_gradients(model, step, size)
        for p, g in zip(model.parameters(), averaged):
            p.grad = g
        if SCENARIO == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        opt.step()
        after.append([p.detach().clone() for p in model.parameters()])
    return after


def difference(params, expected):
    return max(float(((p - q).abs() / (1 + q.abs())).max()) for p, q in zip(params, expected))


def main():
    bps.init()
    rank, size = bps.rank(), bps.size()
    start_seed = rank if SCENARIO == "broadcast" else 0
    model = make_model(start_seed)
    lr = LR * (1 + rank) if SCENARIO == "broadcast" else LR
    base = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    kwargs = {"named_parameters": model.named_parameters()}
    if SCENARIO == "accumulate":
        kwargs["backward_passes_per_step"] = 2
    if SCENARIO == "fp16":
        kwargs["compression"] = bps.Compression.fp16
    opt = bps.DistributedOptimizer(base, **kwargs)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    if SCENARIO == "broadcast":
        bps.broadcast_optimizer_state(opt, root_rank=0)
        if opt.param_groups[0]["lr"] != LR:
            raise SystemExit(f"rank {rank}: lr {opt.param_groups[0]['lr']} after broadcast_optimizer_state")
    expected = reference(size)
    worst = 0.0
    for step in range(STEPS):
        if SCENARIO in ("raise", "sigint") and rank == 1 and step == STEPS // 2:
            if SCENARIO == "raise":
                raise RuntimeError("the user's training loop failed")
            # Ctrl-C as a terminal delivers it (a launcher may start workers with SIGINT ignored)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.kill(os.getpid(), signal.SIGINT)
        opt.zero_grad()
        if SCENARIO == "accumulate":
            for part in range(2):
                loss_of(model, batch(rank, step, part)).backward()
        else:
            loss = loss_of(model, batch(rank, step))
            loss.backward()
        if SCENARIO == "clip":
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        worst = max(worst, difference(model.parameters(), expected[step]))  # read right after step()
        if SCENARIO == "pushpull":
            worst = max(worst, check_user_push_pull(loss, step, size))
    final = expected[-1]
    with torch.no_grad():  # an evaluation pass
        loss_of(model, batch(rank, STEPS))
    worst = max(worst, difference(model.parameters(), final))
    if SCENARIO == "observe":  # a checkpoint, written and read back
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
        worst = max(worst, difference(saved["model"].values(), final))
        momentum = [s["momentum_buffer"] for s in saved["optimizer"]["state"].values()]
        if len(momentum) != len(final):
            raise SystemExit(f"rank {rank}: the checkpoint holds {len(momentum)} momentum buffers")
    total = sum(p.double().sum().item() for p in model.parameters())
    if SCENARIO != "no_shutdown":
        bps.shutdown()
    if SCENARIO == "observe":  # still the same after shutdown
        worst = max(worst, difference(model.parameters(), final))
    print(f"rank {rank} scenario {SCENARIO} sum {total:.9f} diff {worst:.3g}", flush=True)
    return 0 if worst <= TOLERANCE else 3


def check_user_push_pull(loss, step, size):
    """The average loss three ways, as users average their metrics; its largest error."""
    mine = torch.tensor([float(loss)])
    synchronous = bps.push_pull(mine.clone(), average=True, name="user.loss")
    inplace = mine.clone()
    handle = push_pull_async_inplace(inplace, average=True, name="user.loss.inplace")
    while not bps.poll(handle):
        pass
    bps.synchronize(handle)
    expected = sum(float(loss_of(make_model_at(step), batch(r, step))) for r in range(size)) / size
    return max(abs(float(t) - expected) / (1 + abs(expected)) for t in (synchronous, inplace))


def make_model_at(step):
    """The reference model before ``step`` (the losses are computed on it)."""
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for s in range(step):
        for p, g in zip(model.parameters(), reference_gradients(model, s, bps.size())):
            p.grad = g
        opt.step()
    return model


if __name__ == "__main__":
    sys.exit(main())
