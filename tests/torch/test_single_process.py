"""One process, local backend: the plugin's bookkeeping, exactness and edge cases, fast."""
import copy
import json
import subprocess
import sys

import pytest
import torch

from models_for_tests import build, data
from byteps_prophet.profile import load_profile
from byteps_prophet.torch import DistributedOptimizer

SCHEDULERS = ("fifo", "bytescheduler", "prophet")
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
}
# Small partitions so ByteScheduler and Prophet really cut gradients into slices (Prophet queues
# ByteScheduler's partition: prophet_partition=0).
SLICING = dict(partition=64, prophet_partition=0, max_chunk_bytes=256)


def train(model_name, optname, scheduler, steps=6, bpps=1, **kw):
    from byteps_prophet.core import Settings

    model = build(model_name)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = OPTIMIZERS[optname]([p for _, p in params])
    if scheduler is not None:
        settings = Settings(scheduler=scheduler, **SLICING, profile_iterations=2)
        opt = DistributedOptimizer(opt, params, backward_passes_per_step=bpps, settings=settings,
                                   backend="local", **kw)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(bpps):
            x, y = data(model_name, 0, step, micro)
            (torch.nn.functional.mse_loss(model(x), y) / bpps).backward()
        opt.step()
    if scheduler is not None:
        opt.synchronize()
        opt.close()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a, b, tol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=tol, rtol=0), (k, (a[k] - b[k]).abs().max().item())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("optname", sorted(OPTIMIZERS))
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_matches_plain_optimizer(scheduler, optname):
    assert_same(train("mlp", optname, scheduler), train("mlp", optname, None))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_unused_frozen_and_zero_dim_parameters(scheduler):
    ref = train("unused", "sgd", None)
    got = train("unused", "sgd", scheduler)
    assert_same(got, ref)
    fresh = build("unused")
    assert torch.equal(got["unused.weight"], fresh.unused.weight)  # never updated
    assert torch.equal(got["frozen.weight"], fresh.frozen.weight)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_gradient_accumulation(scheduler):
    assert_same(train("mlp", "adam", scheduler, bpps=3), train("mlp", "adam", None, bpps=3))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheduler", ("bytescheduler", "prophet"))
def test_more_than_a_thousand_tensors(scheduler):
    model = build("many")
    assert len(list(model.parameters())) > 1000
    assert_same(train("many", "sgd", scheduler, steps=4), train("many", "sgd", None, steps=4))


@pytest.mark.timeout(120)
def test_profile_is_written_and_valid(tmp_path):
    path = tmp_path / "profile.json"
    train("mlp", "sgd", "prophet", steps=8, profile=str(path), batch_size=8)
    profile = load_profile(path)
    assert profile.framework == "pytorch" and profile.batch == 8
    assert len(profile.iterations) >= 3  # 8 steps - 2 warm-up - the last (never closed)
    ready = profile.median_ready_s()
    assert all(r is not None for r in ready)
    assert ready[0] >= ready[-1]  # the first layer's gradient is ready last
    assert profile.iteration_s and profile.iteration_s > 0


@pytest.mark.timeout(120)
def test_profile_forward_times_leave_out_the_waits_for_updates(tmp_path):
    """The next forward waits for a layer's update inside its container's span. That wait is not
    compute: counted as the next layer's forward time, it would make the simulator replay the step
    too long."""
    import time
    from torch import nn
    from byteps_prophet.backends.base import LocalBackend

    class SlowLink(LocalBackend):
        def wait(self, handle):
            time.sleep(0.1)

    class ContainerThenLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Sequential(nn.Linear(6, 64), nn.ReLU())
            self.last = nn.Linear(64, 3)

        def forward(self, x):
            return self.last(self.first(x))

    torch.manual_seed(0)
    model = ContainerThenLayer()
    path = tmp_path / "profile.json"
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), list(model.named_parameters()),
                               scheduler="fifo", backend=SlowLink(), profile=str(path), batch_size=8)
    for step in range(8):
        opt.zero_grad()
        x, y = data("mlp", 0, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.synchronize()
    opt.close()
    profile = load_profile(path)
    assert profile.iteration_s > 0.2  # the forward did wait: four 100 ms ops, first.0's last
    names = [t.name for t in profile.tensors]
    forward = [it.fwd_s[names.index("last.weight")] for it in profile.iterations]
    assert max(forward) < 0.1, forward  # a linear layer of 64 x 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_state_dict_round_trip_keeps_training_equal(scheduler):
    """Two steps, a checkpoint (model and optimizer state_dict), a fresh model and optimizer resumed
    from it for two more steps: the same parameters as four uninterrupted steps of the plain
    optimizer. Adam's moments live only in the optimizer's state, so a state_dict that loses or
    misplaces them (or a load that does not reach the wrapped optimizer) changes the result."""
    settings = dict(scheduler=scheduler, **SLICING, profile_iterations=2)

    def wrapped(model):
        from byteps_prophet.core import Settings

        named = list(model.named_parameters())
        return DistributedOptimizer(torch.optim.Adam([p for _, p in named], lr=0.01), named,
                                    settings=Settings(**settings), backend="local")

    def steps(model, opt, first, count):
        for step in range(first, first + count):
            opt.zero_grad()
            x, y = data("mlp", 0, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    model = build("mlp")
    opt = wrapped(model)
    steps(model, opt, 0, 2)
    opt.synchronize()
    checkpoint = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                  "opt": copy.deepcopy(opt.state_dict())}
    opt.close()
    assert len(checkpoint["opt"]["state"]) == len(list(model.parameters()))

    resumed = build("mlp")
    resumed.load_state_dict(checkpoint["model"])
    opt = wrapped(resumed)
    opt.load_state_dict(checkpoint["opt"])
    steps(resumed, opt, 2, 2)
    opt.synchronize()
    opt.close()

    plain = build("mlp")
    plain_opt = torch.optim.Adam(plain.parameters(), lr=0.01)
    steps(plain, plain_opt, 0, 4)
    assert_same({k: v.detach() for k, v in resumed.state_dict().items()}, plain.state_dict())


@pytest.mark.timeout(120)
def test_invalid_scheduler_is_one_line(tmp_path):
    env = {"BYTEPS_SCHEDULER": "lifo", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet.ab.workloads.torch_bench", "--model", "mlp", "--steps", "1"],
                          env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "BYTEPS_SCHEDULER='lifo'" in lines[0] and "fifo, bytescheduler, prophet" in lines[0]


def test_invalid_scheduler_raises_config_error():
    from byteps_prophet.errors import ConfigError

    model = build("mlp")
    with pytest.raises(ConfigError, match="valid: fifo, bytescheduler, prophet"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             scheduler="lifo", backend="local")


def test_scheduler_sees_the_backends_link():
    """The scheduler reads the link's description (stages, pulls behind pushes) as it is made: the
    plugin must hand it over before. It once set it after, and Prophet on BytePS modelled a one-stage
    link that sent everything at the end of backward."""
    from byteps_prophet.backends.base import LocalBackend
    from byteps_prophet.core import EngineTraits

    class TwoStage(LocalBackend):
        traits = EngineTraits(name="two-stage", stages=2, pulls_follow_pushes=True)

    model = build("mlp")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), list(model.named_parameters()),
                               scheduler="prophet", backend=TwoStage())
    try:
        scheduler = opt._engine.scheduler
        assert scheduler.traits.stages == 2 and scheduler.traits.pulls_follow_pushes
        assert scheduler._serializations == 2 and scheduler._pulls_follow_pushes
        assert scheduler.bandwidth.serializations == 2
    finally:
        opt.close()


@pytest.mark.timeout(60)
def test_the_scheduler_is_woken_when_it_asks_and_close_stops_the_timer():
    """Prophet asks for a tick when it holds a piece for an event that may come late
    (core/scheduler.py, ``on_wakeup``): the plugin's timer calls it, and closing stops the thread."""
    import threading

    model = build("mlp")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), list(model.named_parameters()),
                               scheduler="prophet", backend="local")
    scheduler = opt._engine.scheduler
    ticked = threading.Event()
    original_tick = scheduler.tick

    def tick():
        original_tick()
        ticked.set()

    scheduler.tick = tick
    try:
        scheduler._wake_at(scheduler.clock.now() + 0.05)
        assert ticked.wait(5.0)
    finally:
        opt.close()
    assert not opt._engine._timer._thread.is_alive()


def test_fuse_knob_is_validated_and_on_by_default():
    from byteps_prophet.core.settings import Settings
    from byteps_prophet.errors import ConfigError

    assert Settings.from_env({}).fuse is True
    assert Settings.from_env({"BYTEPS_PROPHET_FUSE": "0"}).fuse is False
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_FUSE='maybe' is not a boolean; valid: 0, 1"):
        Settings.from_env({"BYTEPS_PROPHET_FUSE": "maybe"})


def test_settings_as_keyword_arguments_override_the_environment(monkeypatch):
    """Every Settings field is a keyword argument of DistributedOptimizer (DDP's style); the
    environment is the fallback for the fields not passed."""
    monkeypatch.setenv("BYTEPS_SCHEDULER", "bytescheduler")
    monkeypatch.setenv("BYTESCHEDULER_CREDIT", "1000")
    monkeypatch.setenv("BYTEPS_PROPHET_OVERLAP", "0")
    model = build("mlp")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                               backend="local", scheduler="prophet", credit=5000, overlap=True)
    try:
        engine = opt._engine
        assert (engine.settings.scheduler, engine.settings.credit, engine.overlap) == ("prophet", 5000, True)
        assert opt.scheduler.name == "prophet"
    finally:
        opt.close()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                               backend="local", overlap=None)  # None: the environment's
    try:
        engine = opt._engine
        assert (engine.settings.scheduler, engine.settings.credit, engine.overlap) == ("bytescheduler", 1000, False)
    finally:
        opt.close()


def test_unknown_keyword_argument_is_one_line_naming_it_and_the_valid_ones():
    from byteps_prophet.errors import ConfigError

    model = build("mlp")
    with pytest.raises(ConfigError) as err:
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             backend="local", credits=5000)
    message = str(err.value)
    assert "\n" not in message
    assert "'credits'" in message
    for valid in ("settings", "backend", "model_name", "batch_size", "scheduler", "credit", "overlap", "profile"):
        assert valid in message.split("valid:", 1)[1], (valid, message)
