"""How the real link is measured (core/link_monitor.py) and Prophet's settings."""
import json

import pytest
import torch

from byteps_prophet.core.link_monitor import LinkMonitor
from byteps_prophet.core import Settings, Task
from byteps_prophet.core.bandwidth import BandwidthMonitor
from byteps_prophet.errors import ConfigError
from byteps_prophet.torch import DistributedOptimizer
from byteps_prophet.torch.prophet_pieces import PROPHET_PARTITION, prophet_settings

BW = 25e6  # bytes/s
COST = 0.002  # what the link really serialises per message
LATENCY = 0.030  # start-up latency of an op on an idle link: overlaps other ops, occupies nothing


def _task(nbytes, k):
    return Task(f"g{k}", k, (nbytes // 4,))


def alone_then_backlogged(monitor):
    """12 ops sent one at a time onto an idle link, a follower 0-200 ms late on some; then a stream of
    24 ops kept two deep in flight (back-to-back on the link)."""
    now = 0.0
    sizes = [8_192, 3_000_000, 400_000, 1_000_000]
    for k in range(12):
        t = _task(sizes[k % 4], k)
        monitor.on_send(t, now)
        late = 0.2 if k % 3 == 0 else 0.0  # rank 1's copy was not ready yet
        now += late + LATENCY + COST + t.nbytes / BW
        monitor.on_finish(t, now)
        now += 0.05
    # back-to-back: op i+1 is sent while op i is in flight; the link serves them in turn
    link_free = now + LATENCY
    tasks = [_task(sizes[k % 4], 100 + k) for k in range(24)]
    monitor.on_send(tasks[0], now)
    for i, t in enumerate(tasks):
        if i + 1 < len(tasks):
            monitor.on_send(tasks[i + 1], link_free - 0.001)
        link_free += COST + t.nbytes / BW
        monitor.on_finish(t, link_free)
    return monitor


def test_core_monitor_mistakes_latency_and_lateness_for_link_cost():
    # the problem LinkMonitor exists for (docs/DESIGN.md, "Link monitor (plugins)"): the core's estimate
    # after ops that ran alone carries their latency and the follower's lateness as a per-message cost
    core = BandwidthMonitor(serializations=1)
    now = 0.0
    for k in range(12):
        t = _task([8_192, 3_000_000, 400_000, 1_000_000][k % 4], k)
        core.on_send(t, now)
        now += (0.2 if k % 3 == 0 else 0.0) + LATENCY + COST + t.nbytes / BW
        core.on_finish(t, now)
        now += 0.05
    assert core.message_cost > 5 * COST


def test_link_monitor_measures_what_the_link_serialises():
    m = alone_then_backlogged(LinkMonitor(serializations=1))
    rate, cost = m.rate_and_cost()
    assert rate == pytest.approx(BW, rel=0.05)
    assert cost == pytest.approx(COST, abs=0.001)
    assert m.bytes_per_s == rate and m.message_cost == cost
    assert m.known and m.in_flight_count == 0
    assert m.latency >= LATENCY * 0.9  # reported separately, not charged per message
    m.reset()
    assert not m.known and m.bytes_per_s is None and m.message_cost == 0.0


def _stream(monitor, rate, ops, start=0.0, jitter=0.0, seed=0):
    """``ops`` ops kept two deep in flight on a link of ``rate`` bytes/s; returns the time at the end."""
    import random

    rng = random.Random(seed)
    sizes = [8_192, 3_000_000, 400_000, 1_000_000]
    link_free = start
    tasks = [_task(sizes[k % 4], k) for k in range(ops)]
    monitor.on_send(tasks[0], start)
    for i, t in enumerate(tasks):
        if i + 1 < len(tasks):
            monitor.on_send(tasks[i + 1], link_free)
        link_free += (COST + t.nbytes / rate) * (1 + rng.uniform(-jitter, jitter))
        monitor.on_finish(t, link_free)
    return link_free


@pytest.mark.parametrize("before, after", [(5 * BW, BW), (BW, 5 * BW)])
def test_link_monitor_follows_a_bandwidth_change_within_a_few_ops(before, after):
    # tc moves the rate (the A/B's --bandwidth-schedule): the old samples must not linger for a
    # whole window (32 back-to-back completions, 2-3 training steps)
    def settled(rate):  # what a monitor that only ever saw this link reports
        fresh = LinkMonitor(serializations=1)
        _stream(fresh, rate, 40)
        return fresh.bytes_per_s

    m = LinkMonitor(serializations=1)
    now = _stream(m, before, 40)
    assert m.bytes_per_s == pytest.approx(settled(before), rel=0.02)
    _stream(m, after, 12, start=now)
    assert m.bytes_per_s == pytest.approx(settled(after), rel=0.1)
    assert m.shifts == 1


def test_after_a_change_a_burst_of_completions_is_not_taken_for_the_new_rate():
    m = LinkMonitor(serializations=1)
    now = _stream(m, BW, 40)
    now = _stream(m, 5 * BW, 8, start=now)
    assert m.shifts == 1
    big, tiny = _task(4_000_000, 900), _task(8_192, 901)
    m.on_send(big, now)
    now += COST + big.nbytes / (5 * BW)
    m.on_send(tiny, now - 1e-6)  # "delivers" the big op's 4 MB in 2 us: 2 TB/s
    m.on_finish(big, now)
    m.on_finish(tiny, now + 1e-6)
    assert m.bytes_per_s < 2 * 5 * BW


def test_link_monitor_keeps_its_window_on_a_jittery_but_steady_link():
    m = LinkMonitor(serializations=1)
    _stream(m, BW, 400, jitter=0.25, seed=3)
    assert m.shifts == 0
    assert m.bytes_per_s == pytest.approx(BW, rel=0.15)


def test_link_monitor_falls_back_to_delivery_rate():
    m = LinkMonitor(serializations=2)
    t = _task(1_000_000, 0)
    m.on_send(t, 0.0)
    m.on_finish(t, 0.1)
    assert m.known and m.bytes_per_s == pytest.approx(1e7) and m.message_cost == 0.0


def test_prophet_partition_default_and_overrides():
    prophet = Settings(scheduler="prophet")
    assert prophet_settings(prophet).partition == PROPHET_PARTITION
    assert prophet_settings(prophet, pulls_follow_pushes=True).partition == Settings().partition
    assert prophet_settings(Settings(scheduler="bytescheduler")).partition == Settings().partition
    # a partition set for ByteScheduler is Prophet's only where BYTEPS_PROPHET_PARTITION says so (0)
    assert prophet_settings(Settings(scheduler="prophet", partition=64)).partition == PROPHET_PARTITION
    assert prophet_settings(Settings(scheduler="prophet", partition=64, prophet_partition=0)).partition == 64
    assert prophet_settings(Settings(scheduler="prophet", partition=64, prophet_partition=0),
                            pulls_follow_pushes=True).partition == 64
    assert prophet_settings(Settings(scheduler="prophet", partition=64, prophet_partition=123)).partition == 123
    env = {"BYTEPS_SCHEDULER": "prophet", "BYTEPS_PROPHET_PARTITION": "0"}
    assert prophet_settings(Settings.from_env(env)).partition == Settings().partition
    env["BYTEPS_PROPHET_PARTITION"] = "123"
    assert prophet_settings(Settings.from_env(env)).partition == 123
    assert prophet_settings(Settings.from_env(env), pulls_follow_pushes=True).partition == 123
    env["BYTEPS_PROPHET_PARTITION"] = "0"
    for partition in ("500", str(Settings().partition)):
        assert prophet_settings(Settings.from_env(dict(env, BYTESCHEDULER_PARTITION=partition))).partition == \
            int(partition)
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_PARTITION"):
        Settings.from_env(dict(env, BYTEPS_PROPHET_PARTITION="x"))
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_PARTITION"):
        Settings.from_env(dict(env, BYTEPS_PROPHET_PARTITION="-3"))


def _mlp_opt(**kw):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                               backend="local", **kw)
    return model, opt


def test_plugin_installs_link_monitor_and_writes_trace(tmp_path, monkeypatch, perfetto_check):
    trace = tmp_path / "trace.json"
    monkeypatch.setenv("BYTEPS_PROPHET_TRACE", str(trace))
    model, opt = _mlp_opt(scheduler="prophet")
    assert isinstance(opt.scheduler.bandwidth, LinkMonitor)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    opt.synchronize()
    opt.close()
    data = perfetto_check(trace)
    kinds = [e.get("cat") for e in data["traceEvents"]]
    assert kinds.count("ready") == 3 * 4 and kinds.count("eob") == 3 and kinds.count("step") == 3
    ops = [e for e in data["traceEvents"] if e.get("cat") == "op"]
    assert all(e["ph"] == "X" and e["args"]["submit_ts"] == e["ts"] for e in ops)
    # every row of every gradient synchronised once per iteration
    for it in range(3):
        for idx, (name, shape) in enumerate((n, tuple(p.shape)) for n, p in model.named_parameters()):
            rows = sorted(e["args"]["rows"] for e in ops if e["args"]["iteration"] == it and e["args"]["index"] == idx)
            assert rows[0][0] == 0 and rows[-1][1] == shape[0]
            assert all(a[1] == b[0] for a, b in zip(rows, rows[1:])), rows
    assert data["metadata"]["scheduler"] == "prophet" and len(data["metadata"]["tensors"]) == 4


@pytest.mark.parametrize("variable", ["BYTEPS_PROPHET_TRACE", "BYTEPS_PROPHET_PROFILE"])
def test_a_path_in_a_missing_directory_stops_the_start_not_the_end(tmp_path, monkeypatch, variable):
    monkeypatch.setenv(variable, str(tmp_path / "missing" / "x.json"))
    with pytest.raises(ConfigError) as err:
        _mlp_opt(scheduler="prophet")
    assert variable in str(err.value) and "missing" in str(err.value) and "\n" not in str(err.value)


def test_link_mode_core_and_invalid(monkeypatch):
    monkeypatch.setenv("BYTEPS_PROPHET_LINK", "core")
    _, opt = _mlp_opt(scheduler="prophet")
    assert type(opt.scheduler.bandwidth) is BandwidthMonitor
    opt.close()
    monkeypatch.setenv("BYTEPS_PROPHET_LINK", "bogus")
    with pytest.raises(ConfigError, match="BYTEPS_PROPHET_LINK.*measured, core"):
        _mlp_opt(scheduler="prophet")
