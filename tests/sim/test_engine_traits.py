"""The simulator models the engine's traits, and every Prophet rule for such an engine runs in it."""
import json
import math

import pytest

from byteps_prophet.cli import main
from byteps_prophet.core import EngineTraits, Settings, Task
from byteps_prophet.core.traits import PRESETS, SCHEMA, load_engine, save_engine
from byteps_prophet.errors import ConfigError, UserError
from byteps_prophet.sim.simulation import Layer, SimulatedCluster, Simulation
from byteps_prophet.sim.network import Conditions, ParameterServerNetwork, RingAllReduceNetwork

from tests.sim.test_engine import assert_every_row_sent_once

RATE = 1e9  # bytes/s


class Loop:
    def __init__(self):
        self.time, self.events = 0.0, []

    def at(self, when, callback, arg):
        self.events.append((when, callback, arg))

    def run(self):
        done = {}
        while self.events:
            self.events.sort(key=lambda e: e[0])
            self.time, callback, arg = self.events.pop(0)
            if callback is None:
                done[arg.key] = self.time
            else:
                callback(arg)
        return done


def ps(traits, workers=1):
    loop = Loop()
    net = ParameterServerNetwork(workers, traits, Conditions(RATE), 0.0, loop.at, lambda: loop.time)
    net.on_finished = lambda task: loop.events.append((loop.time, None, task))
    return net, loop


def task(name, nbytes):
    return Task(name, 0, (nbytes // 4,))


def test_pull_requests_wait_behind_pushes_queued_before_them():
    """A small piece sent behind a 10 MB one: where pulls follow pushes its pull is requested only
    once its push is acknowledged, behind the bytes queued on the uplink by then: the 10 MB pushed
    after it, and big's request too (its pull first)."""
    # without: small's pull follows big's on the downlink (10 + 10 + 1 ms); with: both requests wait
    # for late's push (21 ms), then big's pull and small's (+ 10 + 1 ms)
    for follows, expected in ((False, 0.021), (True, 0.032)):
        net, loop = ps(EngineTraits(stages=2, pulls_follow_pushes=follows))
        net.send(task("big", 10_000_000))
        net.send(task("small", 1_000_000))
        net.send(task("late", 10_000_000))  # pushed before small's ack: small's request queues behind it
        done = loop.run()
        assert done["small"] == pytest.approx(expected, rel=1e-6)


def test_back_pressure_holds_pull_requests_until_the_server_has_the_pushes():
    """Two workers on one server: each worker's 1 MB push takes 1 ms on its own link but 2 ms through
    the server's ingress, which both workers' pushes share. Six pushes at once: without back-pressure
    the worker's link is through with them after 6 ms and the first pull request goes then (first op
    done at 6 + 2 ms of pull through the server's egress); with it, the worker's queue drains only as
    the server takes the pushes, so the first request waits for all 12 ms of them, as the calibrated
    engines' bursts show (docs/ENGINE.md). The pushes finish at the same times either way."""
    firsts, lasts = {}, {}
    for pressed in (False, True):
        net, loop = ps(EngineTraits(stages=2, pulls_follow_pushes=True, backpressure=pressed, servers=1), workers=2)
        for i in range(6):
            net.send(task(f"op{i}", 1_000_000))
        done = loop.run()
        firsts[pressed], lasts[pressed] = done["op0"], max(done.values())
    assert firsts[False] == pytest.approx(0.008) and lasts[False] == pytest.approx(0.018)
    assert firsts[True] == pytest.approx(0.014) and lasts[True] == pytest.approx(0.024)


def test_back_pressure_changes_nothing_for_pushes_alone_or_without_pull_requests():
    for traits in (EngineTraits(stages=2, backpressure=True, servers=1), EngineTraits(stages=2, servers=1)):
        net, loop = ps(traits, workers=2)  # pulls do not follow pushes: nothing queues behind them
        for i in range(3):
            net.send(task(f"op{i}", 1_000_000))
        assert loop.run() == {"op0": pytest.approx(0.004), "op1": pytest.approx(0.006), "op2": pytest.approx(0.008)}


def test_duplex_efficiency_slows_a_direction_only_while_the_other_is_busy():
    """One server, two workers (each 1 MB op: 2 ms through each server direction). a's pull (2-4 ms)
    and b's push, sent at 2 ms, share the time both directions are busy: at efficiency 0.8 b's push
    does 1.6 ms of its work by 4 ms, the rest at full rate (4.4 ms), and a's pull, booked first, keeps
    its time (the model does not look ahead). b's pull then starts on an idle link: 4.4 + 2 ms. An op
    alone is not slowed."""
    for e, b_done in ((1.0, 0.006), (0.8, 0.0064)):
        net, loop = ps(EngineTraits(stages=2, servers=1, duplex_efficiency=e), workers=2)
        net.send(task("a", 1_000_000))
        loop.events.append((0.002, lambda t: net.send(t), task("b", 1_000_000)))
        done = loop.run()
        assert done["a"] == pytest.approx(0.004) and done["b"] == pytest.approx(b_done)
    net, loop = ps(EngineTraits(stages=2, servers=1, duplex_efficiency=0.8), workers=2)
    net.send(task("a", 1_000_000))
    assert loop.run()["a"] == pytest.approx(0.004)


def test_a_pull_in_the_reply_does_not_queue_behind_later_pushes():
    """The scenario of the first test, on an engine that answers the push with the values (MXNet's
    pushpull): small's values leave the server as soon as its push is in (11 ms), not after a pull
    request queued behind late's push (21 ms): done after its own pull, behind big's on the downlink
    (big's pull from 10 ms, 10 ms; small's 1 ms): 21 ms, not 32. With back-pressure too (a burst of six
    on two workers, each push 2 ms through the server): the first answer after two pushes' time (4 ms),
    not after all six (14 ms); pushes keep their times."""
    net, loop = ps(EngineTraits(stages=2, pulls_follow_pushes=True, pull_in_reply=True))
    net.send(task("big", 10_000_000))
    net.send(task("small", 1_000_000))
    net.send(task("late", 10_000_000))
    assert loop.run()["small"] == pytest.approx(0.021)
    firsts = {}
    for in_reply in (False, True):
        net, loop = ps(EngineTraits(stages=2, pulls_follow_pushes=True, backpressure=True, servers=1,
                                    pull_in_reply=in_reply), workers=2)
        for i in range(6):
            net.send(task(f"op{i}", 1_000_000))
        done = loop.run()
        firsts[in_reply] = done["op0"]
        if in_reply:
            assert max(done.values()) == pytest.approx(0.014)  # the last push at 12 ms, its answer 2 ms
    assert firsts == {False: pytest.approx(0.014), True: pytest.approx(0.004)}


def test_start_up_latency_delays_an_op_on_an_idle_link_only():
    net, loop = ps(EngineTraits(stages=2, startup_latency_s=0.005))
    net.send(task("a", 1_000_000))
    net.send(task("b", 1_000_000))
    done = loop.run()
    assert done["a"] == pytest.approx(0.005 + 0.002)
    assert done["b"] == pytest.approx(0.005 + 0.003)  # queued behind a: its latency overlapped


def test_atoms_pay_the_message_cost_each_and_half_duplex_shares_the_link():
    traits = EngineTraits(stages=2, message_cost_s=1e-4, atom_elements=62_500)
    net, loop = ps(traits)  # a piece not cut into atoms (FIFO, ByteScheduler): one message
    net.send(task("a", 1_000_000))
    assert loop.run()["a"] == pytest.approx(2 * (1e-4 + 0.001))
    net, loop = ps(traits)
    net.use_atoms(traits.atom_elements)  # Prophet's cuts, sent as 4 atoms of 250 kB
    net.send(task("a", 1_000_000))
    assert loop.run()["a"] == pytest.approx(2 * (4e-4 + 0.001))
    net, loop = ps(EngineTraits(stages=2, duplex=False))
    net.send(task("a", 1_000_000))
    net.send(task("b", 1_000_000))
    done = loop.run()
    assert done["b"] == pytest.approx(0.004)  # a's pull and b's push share the one link


def test_fewer_servers_share_their_links():
    net, loop = ps(EngineTraits(stages=2, servers=1), workers=4)
    net.send(task("a", 1_000_000))
    assert loop.run()["a"] == pytest.approx(2 * 0.004)  # four workers' bytes through one server


def test_ring_pays_the_start_up_latency_and_its_steps():
    loop = Loop()
    net = RingAllReduceNetwork(4, EngineTraits(stages=1, message_cost_s=1e-4, startup_latency_s=0.002),
                               Conditions(RATE), 0.0, loop.at, lambda: loop.time)
    net.on_finished = lambda t: loop.events.append((loop.time, None, t))
    net.send(task("a", 1_000_000))
    assert loop.run()["a"] == pytest.approx(0.002 + 6 * 1e-4 + 1.5 * 0.001)


def layers(n=6, bwd=2e-3):
    return [Layer(f"l{i}", (256, 1024), fwd_s=1e-3, bwd_s=bwd) for i in range(n)]


def test_every_prophet_rule_for_pulls_following_pushes_runs_in_the_simulator():
    """With the BytePS engine Prophet models the request-wait stage, caps chunks and plans its steps,
    and still sends every row exactly once; the ideal engine gives none of those rules."""
    engine = PRESETS["byteps"].replace(message_cost_s=50e-6, startup_latency_s=0.002)
    cluster = SimulatedCluster(workers=4, bandwidth=0.25e9, engine=engine)
    sim = Simulation(layers(), cluster, Settings(scheduler="prophet"), iterations=12, warmup=4)
    result = sim.run()
    prophet = sim.scheduler
    assert prophet.traits.pulls_follow_pushes and len(prophet.link.stage_free) == 3 and prophet.cut_elements == 250_000
    assert prophet.planned_iterations > 0
    assert type(prophet.bandwidth).__name__ == "LinkMonitor" and prophet.bandwidth.latency > 0
    assert max(p.nbytes for p in result.sent if p.iteration >= 4) <= 1.25 * 2 * 1024 * 1024
    assert_every_row_sent_once(result, layers(), 12)
    ideal = Simulation(layers(), SimulatedCluster(workers=4, bandwidth=0.25e9), Settings(scheduler="prophet"), 12, 4)
    assert not ideal.scheduler.traits.pulls_follow_pushes and len(ideal.scheduler.link.stage_free) == 2


def test_compute_slowdown_and_stragglers_stretch_a_compute_bound_step():
    fast = dict(bandwidth=100e9, workers=8)
    base = Simulation(layers(), SimulatedCluster(**fast), Settings(), 10, 2).run().iter_s
    slow = Simulation(layers(), SimulatedCluster(**fast, slow_worker=1.5), Settings(), 10, 2).run().iter_s
    assert slow == pytest.approx(1.5 * base, rel=0.01)
    jitter = [Simulation(layers(), SimulatedCluster(**{**fast, "workers": w}, jitter=0.05), Settings(), 10, 2).run().iter_s
              for w in (2, 256)]
    assert base < jitter[0] < jitter[1] < 1.25 * base  # the slowest of more workers is slower
    busy = SimulatedCluster(workers=8, bandwidth=1e9, engine=PRESETS["ideal-ps"].replace(compute_slowdown=1.3))
    idle = SimulatedCluster(workers=8, bandwidth=1e9, engine=PRESETS["ideal-ps"])
    assert Simulation(layers(), busy, Settings(), 10, 2).run().iter_s > Simulation(layers(), idle, Settings(), 10, 2).run().iter_s


def test_an_engine_must_fit_the_architecture():
    with pytest.raises(UserError, match="does not fit engine 'gloo'"):
        SimulatedCluster(arch="ps", engine=PRESETS["gloo"])


def test_engine_profile_round_trip_and_one_line_errors(tmp_path):
    path = tmp_path / "e.json"
    traits = EngineTraits(name="byteps", stages=2, pulls_follow_pushes=True, message_cost_s=1e-4)
    save_engine(str(path), traits, {"samples": [1, 2]})
    assert load_engine(str(path)) == traits and json.loads(path.read_text())["schema"] == SCHEMA
    assert load_engine("gloo") == PRESETS["gloo"]
    cases = {
        '{"schema": "other", "traits": {}}': "schema 'other' is not supported",
        f'{{"schema": "{SCHEMA}", "traits": {{"stage": 2}}}}': "unknown trait 'stage'; valid:",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 3}}}}': "stages=3 is invalid; valid: 1",
        f'{{"schema": "{SCHEMA}", "traits": {{"message_cost_s": -1}}}}': "message_cost_s=-1 is invalid",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 2, "backpressure": "yes"}}}}':
            "backpressure='yes' is invalid; valid: true or false",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 1, "backpressure": true}}}}':
            "backpressure=True is invalid; valid: false unless stages is 2",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 2, "duplex_efficiency": 0.2}}}}':
            r"duplex_efficiency=0.2 is invalid; valid: a number in \[0.5, 1\]",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 2, "duplex_efficiency": "high"}}}}':
            "duplex_efficiency='high' is invalid",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 2, "pull_in_reply": 1}}}}':
            "pull_in_reply=1 is invalid; valid: true or false",
        f'{{"schema": "{SCHEMA}", "traits": {{"stages": 1, "pull_in_reply": true}}}}':
            "pull_in_reply=True is invalid; valid: false unless stages is 2",
        "not json": "is not readable JSON",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as err:
            load_engine(str(path))
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_engine(str(tmp_path / "missing.json"))


def test_simulate_takes_an_engine_file(capsys, tmp_path):
    path = tmp_path / "e.json"
    save_engine(str(path), PRESETS["byteps"].replace(bandwidth_bytes_per_s=125e6, servers=1))
    assert main(["simulate", "--model", "alexnet", "--workers", "2", "--engine", str(path), "--iterations", "8",
                 "--scheduler", "prophet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arch"] == "ps" and out["servers"] == 1 and out["engine"]["pulls_follow_pushes"]
    assert out["bandwidth"] == "125000000bps" and math.isfinite(out["results"]["prophet"]["iter_ms"])
    path.write_text("{}")
    assert main(["simulate", "--model", "alexnet", "--engine", str(path)]) == 2
    assert "schema" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_the_hold_never_asks_for_the_same_instant_forever():
    """With a start-up latency the hold wakes at ``start - latency``; asked as ``start > now + latency``
    that could still hold by rounding at the tick itself, which then asked for the same instant again,
    forever (ResNet-50 on the calibrated BytePS engine hung the scale grid). Ticks stay a fraction of
    the sends."""
    from byteps_prophet.sim.costmodel import compute_times
    from byteps_prophet.sim.simulation import layers_from
    from byteps_prophet.sim.zoo import get_model

    model = get_model("resnet50")
    engine = PRESETS["byteps"].replace(startup_latency_s=0.00306756)
    sim = Simulation(layers_from(model, compute_times(model, 32)), SimulatedCluster(workers=2, bandwidth=1e9 / 8,
                     engine=engine), Settings(scheduler="prophet"), iterations=12, warmup=4)
    ticks = []
    tick = sim.scheduler.tick
    sim.scheduler.tick = lambda: (ticks.append(sim.loop.time), tick())
    result = sim.run()
    assert sim.scheduler.planned_iterations > 0
    assert len(ticks) < 2 * len(result.sent), (len(ticks), len(result.sent))


def test_the_plugins_atom_setting_sets_the_simulated_engines_atoms():
    """BYTEPS_PROPHET_ATOM_ELEMENTS (Settings.atom_elements) sets the atoms in the simulator as in the
    plugin (BytePS-MXNet sends Prophet's atoms as ByteScheduler's partition, 1 M elements); an engine
    without atoms (gloo, the ideal ones) keeps none."""
    cluster = SimulatedCluster(workers=2, bandwidth=0.25e9, engine=PRESETS["byteps"])
    own = Simulation(layers(), cluster, Settings(scheduler="prophet"), iterations=6, warmup=2)
    set_ = Simulation(layers(), cluster, Settings(scheduler="prophet", atom_elements=65_536), iterations=6, warmup=2)
    assert own.scheduler.cut_elements == 250_000 and own.network.traits.atom_elements == 250_000
    assert set_.scheduler.cut_elements == 65_536 and set_.network.traits.atom_elements == 65_536
    ideal = Simulation(layers(), SimulatedCluster(workers=2, bandwidth=0.25e9), Settings(atom_elements=65_536), 6, 2)
    assert ideal.network.traits.atom_elements == 0


def test_only_prophets_pieces_go_out_as_atoms():
    """As in the plugins (``Backend.use_atoms`` under Prophet only), FIFO's and ByteScheduler's pieces
    are one message each: an engine's atoms and a per-message cost change nothing for them."""
    costly = PRESETS["byteps"].replace(message_cost_s=2e-3)
    for name in ("fifo", "bytescheduler"):
        times = [Simulation(layers(), SimulatedCluster(workers=2, bandwidth=0.25e9, engine=costly.replace(atom_elements=atom)),
                            Settings(scheduler=name), 6, 2).run().iter_s for atom in (250_000, 1_000)]
        assert times[0] == pytest.approx(times[1])
    fine, coarse = (Simulation(layers(), SimulatedCluster(workers=2, bandwidth=0.25e9, engine=costly),
                               Settings(scheduler="prophet", atom_elements=atom), 6, 2).run().iter_s
                    for atom in (1_000, 250_000))
    assert fine > coarse  # Prophet's cuts pay the cost per atom


def test_a_stream_replayed_with_a_window_pipelines_and_a_burst_sends_every_push_first():
    """``stream_done_s``, the calibration's streams as the network runs them: with back-pressure and
    pulls following pushes a burst completes after every push and every pull (2 x ops pushes through
    the server's ingress, two workers), a window of one after each op's own round trip."""
    from byteps_prophet.sim.replay import stream_done_s

    engine = EngineTraits(stages=2, pulls_follow_pushes=True, backpressure=True, servers=1)
    push = 2 * 1_000_000 / RATE  # two workers' pushes of 1 MB through one server's ingress
    burst = stream_done_s(engine, RATE, 2, 1_000_000, 4, 4)
    assert min(burst) == pytest.approx(5 * push) and max(burst) == pytest.approx(8 * push)
    one_at_a_time = stream_done_s(engine, RATE, 2, 1_000_000, 4, 1)
    assert one_at_a_time == pytest.approx([2 * push * (i + 1) for i in range(4)])


def test_workers_bursting_in_step_share_the_server_equally_and_finish_together():
    """``bursts_done_s``, two workers each sending one burst of four 1 MB ops at once on the shared
    server links (as the skew investigations measured the real engine, docs/ENGINE.md "Workers out of
    step"): each direction shared equally, every pull behind every push, so both workers get the same answers at the same moments, 5 to 8 pushes' time
    (as one representative's burst), and at half the rate twice as late; a worker ahead has the link to
    itself until the other starts."""
    from byteps_prophet.sim.replay import bursts_done_s

    def burst_done_s(*args, starts=None):  # each worker's answers of its one burst
        return [runs[0][1] for runs in bursts_done_s(*args, 1, starts)]

    engine = EngineTraits(stages=2, pulls_follow_pushes=True, backpressure=True, servers=1)
    push = 2 * 1_000_000 / RATE
    first, second = burst_done_s(engine, RATE, 2, 1_000_000, 4)
    assert first == pytest.approx([5 * push, 6 * push, 7 * push, 8 * push]) and second == pytest.approx(first)
    assert burst_done_s(engine, RATE / 2, 2, 1_000_000, 4)[0] == pytest.approx([2 * t for t in first])
    # Worker 1 four pushes late: worker 0 pushes alone (1 ms each), its answers follow worker 1's pushes
    # one by one, the last shared with worker 1's first; worker 1's come after its own pushes.
    early, late = burst_done_s(engine, RATE, 2, 1_000_000, 4, starts=(0.0, 0.004))
    assert early == pytest.approx([0.006, 0.007, 0.008, 0.010]) and late == pytest.approx([0.010, 0.011, 0.012, 0.013])
    # Ops handed over 3 ms apart (``gaps_s``), as a backward pass hands gradients over: each op's pushes
    # share the ingress (2 ms), its pulls the egress (2 ms) while the next op's pushes come in.
    for runs in bursts_done_s(engine, RATE, 2, 1_000_000, 4, 1, None, gaps_s=(0.003, 0.003)):
        assert runs[0][1] == pytest.approx([0.004, 0.007, 0.010, 0.013])
    # Two bursts each, 5 ms of compute between (``compute_s``): the second sent 5 ms after the first's
    # last answer, and as long.
    for (start0, done0), (start1, done1) in bursts_done_s(engine, RATE, 2, 1_000_000, 4, 2, None, compute_s=0.005):
        assert start1 == pytest.approx(done0[-1] + 0.005)
        assert [t - start1 for t in done1] == pytest.approx([t - start0 for t in done0])


def test_bytes_move_slower_while_the_worker_computes():
    """comm_slowdown: a collective sent while the simulated worker computes runs at the rate over it;
    one sent while the worker waits for its parameters, at the full rate."""
    engine = EngineTraits(name="gloo", stages=1, comm_slowdown=1.5)
    loop = Loop()
    net = RingAllReduceNetwork(2, engine, Conditions(RATE), 0.0, loop.at, lambda: loop.time)
    net.on_finished = lambda t: loop.events.append((loop.time, None, t))
    computing = [True]
    net.computing = lambda: computing[0]
    net.send(task("busy", 1_000_000))
    assert loop.run()["busy"] == pytest.approx(1.5 * 0.001)
    computing[0] = False
    net.send(task("idle", 1_000_000))
    assert loop.run()["idle"] == pytest.approx(1.5 * 0.001 + 0.001)
    fast = dict(bandwidth=1e9, workers=2, arch="allreduce")  # and in a simulation: a step overlapping compute is slower
    base = Simulation(layers(), SimulatedCluster(**fast, engine=PRESETS["gloo"]), Settings(), 10, 2).run().iter_s
    slow = Simulation(layers(), SimulatedCluster(**fast, engine=PRESETS["gloo"].replace(comm_slowdown=3.0)), Settings(),
                      10, 2).run().iter_s
    assert slow > base
