"""The cost Prophet's fused collectives read from the plugins' LinkMonitor is calibrate's: the same
least-squares line through back-to-back service samples (docs/DESIGN.md, "Fused collectives", "The
cost fusion reads"). gloo runs two collectives at once and completes them in pairs."""
import pytest

from byteps_prophet.calibrate.fit import fit_link, service_samples
from byteps_prophet.core import Task
from byteps_prophet.core.link_monitor import LinkMonitor

COST = 0.0015  # what the link serialises per collective
BW = 120e6  # bytes/s
SIZES = [16_384, 65_536, 262_144, 1_048_576, 2_097_152]


def paired_stream(ops=10):
    """calibrate's back-to-back groups (``ops`` ops of one size issued at once, one group after the
    other), served two at a time as gloo does: a pair takes two ops' service and both complete at
    its end, 0.1 ms apart."""
    groups, now = [], 0.0
    for size in SIZES * 2:
        issued = [now + 1e-5 * k for k in range(ops)]
        done, free = [], now + 0.002
        for k in range(0, ops, 2):
            free += 2 * (COST + size / BW)
            done += [free - 1e-4, free]
        groups.append({"tensor_bytes": size, "link_bytes": float(size), "issued": issued, "done": done})
        now = free + 0.003
    return groups


def replay(groups, monitor):
    events = []
    for group in groups:
        for k, (sent, done) in enumerate(zip(group["issued"], group["done"])):
            task = Task(f"g{len(events)}", k, (group["tensor_bytes"] // 4,))
            events += [(sent, 0, task), (done, 1, task)]
    for t, kind, task in sorted(events, key=lambda e: (e[0], e[1])):
        (monitor.on_send if kind == 0 else monitor.on_finish)(task, t)
    return monitor


def test_paired_completions_hide_the_cost_from_the_quantile_but_not_from_the_line():
    groups = paired_stream()
    monitor = replay(groups, LinkMonitor(serializations=1))
    rate, cost = monitor.rate_and_cost()
    assert cost < COST / 5  # every other gap is 0.1 ms: the low quantile of the residuals reads ~0
    rate, collective = monitor.rate_and_cost(collective=True)
    calibrated_cost, calibrated_rate = fit_link(service_samples(groups))
    assert calibrated_cost == pytest.approx(COST, rel=0.1)
    assert collective == pytest.approx(calibrated_cost, rel=0.1)
    assert calibrated_rate * 0.85 <= rate <= calibrated_rate  # (capped by the best delivery rate seen)
