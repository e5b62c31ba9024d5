"""scripts/bench_shares.py: two workers' bursts read on their shared clock, and the real run."""
import json
import math
from pathlib import Path

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_shares")


def test_a_burst_is_read_on_the_clock_both_workers_share(bench):
    """Worker 1 started its burst 0.01 s after worker 0; its answers, 1.0 and 2.5 s into its own burst,
    came 1.01 and 2.51 s after worker 0 started (whose came 0.8 and 2.1 s in): 0.41 s later."""
    first = [{"lead": 0.0, "start": 100.0, "done_s": [0.8, 1.5, 2.1]}, {"lead": 0.0, "start": 200.0, "done_s": [1.0, 3.0]},
             {"lead": 0.3, "start": 300.0, "done_s": [1.2, 2.5]}]
    second = [{"lead": 0.0, "start": 100.01, "done_s": [1.0, 1.7, 2.5]}, {"lead": 0.0, "start": 200.0, "done_s": [0.9, 2.6]},
              {"lead": 0.3, "start": 300.3, "done_s": [1.5, 2.5]}]
    rows = bench.answers_s(first, second)
    assert rows[0]["first_s"] == pytest.approx([0.8, 1.01]) and rows[0]["last_s"] == pytest.approx([2.1, 2.51])
    assert rows[0]["last_later_s"] == pytest.approx(0.41) and rows[0]["lead_s"] == pytest.approx(0.01)
    assert rows[0]["done_s"] == [pytest.approx([0.8, 1.5, 2.1]), pytest.approx([1.01, 1.71, 2.51])]
    assert rows[1]["last_later_s"] == pytest.approx(-0.4)
    assert rows[2]["lead"] == 0.3 and rows[2]["last_s"] == pytest.approx([2.5, 2.8])
    summary = bench.summary(rows)
    assert list(summary) == ["0", "0.3"] and summary["0"]["bursts"] == 2 and summary["0.3"]["bursts"] == 1
    assert summary["0"]["last_later_mean_s"] == pytest.approx(0.005)
    assert summary["0"]["last_later_sd_s"] == pytest.approx(0.405)
    assert summary["0"]["last_s"] == pytest.approx([2.55, 2.555])


def test_chained_bursts_give_each_workers_period_and_worker_1s_lead_burst_by_burst(bench):
    """Two chains of three bursts, worker 1 starting 0.2 s late and falling behind 0.1 s a burst in the
    first, keeping its lead in the second; the simulator's chain, a pair 0.6 s apart, stays apart."""
    def chain(t0, periods, leads):
        starts = [t0 + sum(periods[:k]) for k in range(len(periods) + 1)]
        first = [{"lead": 0.2, "k": k, "start": t, "done_s": [1.0, 2.0]} for k, t in enumerate(starts)]
        second = [{"lead": 0.2, "k": k, "start": t + lead, "done_s": [1.0, 2.0]} for k, (t, lead) in enumerate(zip(starts, leads))]
        return first, second

    a1, b1 = chain(10.0, [2.0, 2.0], [0.2, 0.3, 0.4])
    a2, b2 = chain(20.0, [3.0, 3.0], [0.2, 0.2, 0.2])
    rows = bench.answers_s(a1 + a2, b1 + b2)
    summary = bench.summary(rows)["0.2"]
    assert summary["bursts"] == 2  # the first burst of each chain, after its pause
    assert summary["chain"]["period_s"] == pytest.approx([2.5, 2.55])
    assert summary["chain"]["lead_s"] == pytest.approx([0.2, 0.25, 0.3])
    simulated = bench.simulated(bench.bench_replay.OUT / "engine_byteps.json", [0.6], chain=4)["0.6"]["chain"]
    assert len(simulated["lead_s"]) == 4 and simulated["lead_s"][0] == pytest.approx(0.6)
    assert all(lead > 0.3 for lead in simulated["lead_s"]) and 1.5 < simulated["period_s"][0] < 3.0


def test_the_sampled_links_give_worker_1s_share_of_the_bytes_sent_after_it_starts(bench):
    """Worker 0 sends 1 MB every 0.1 s from its start; worker 1, 0.2 s later, 2 MB every 0.1 s for
    0.2 s, then 1 MB: its share is 2/3, 2/3, then 1/2; where neither sends, none."""
    def link(rates):  # cumulative bytes every 0.05 s, from per-0.1 s rates
        sent, series = 0, [[0.0, 0, 0]]
        for k, rate in enumerate(rates):
            for half in (1, 2):
                sent += rate // 2
                series.append([round(0.1 * k + 0.05 * half, 2), sent, 0])
        return series

    first = {"start": 50.0, "link": link([1_000_000] * 14)}
    second = {"start": 50.2, "link": link([2_000_000] * 2 + [1_000_000] * 7 + [0] * 3)}
    shares = bench.sent_shares(first, second)
    assert len(shares) == bench.SHARE_BINS
    assert shares[:2] == pytest.approx([2 / 3] * 2, abs=1e-3) and shares[2:9] == pytest.approx([0.5] * 7, abs=1e-3)
    assert shares[9] == 0.0  # worker 1's link is through after 0.9 s of its own
    rows = bench.answers_s([{**first, "lead": 0.2, "done_s": [1.0, 2.0]}], [{**second, "lead": 0.2, "done_s": [1.0, 2.0]}])
    assert bench.summary(rows)["0.2"]["sent_shares"][:3] == pytest.approx([0.667, 0.667, 0.5])


def test_the_link_sampler_reads_this_hosts_counters_while_in_use(bench):
    """On loopback, 20 kB sent over TCP in 20 writes: samples every few ms, counters that only grow, the
    bytes and at least one TCP segment sent during the sampling."""
    import socket
    import time

    sampler = bench.LinkSampler(device="lo", period=0.002)
    with socket.create_server(("127.0.0.1", 0)) as server:
        with sampler, socket.create_connection(server.getsockname()) as client:
            peer, _ = server.accept()
            with peer:
                for _ in range(20):
                    client.sendall(b"x" * 1000)
                    peer.recv(4096)
                    time.sleep(0.002)
    series = sampler.relative(sampler.series[0][0])
    assert len(series) >= 5 and series[0] == [0.0, 0, 0]
    assert all(b[1] >= a[1] and b[0] >= a[0] for a, b in zip(series, series[1:]))
    assert series[-1][1] >= 20 * 1000
    sent, retransmitted = sampler.segments
    assert sent >= 20 and retransmitted >= 0


def test_misuse_is_one_line_and_exit_2(bench, capsys):
    for argv, culprit in ((["--reps", "0"], "--reps 0"), (["--clusters", "0"], "--clusters 0"),
                          (["--chain", "0"], "--chain 0"), (["--tcp", ","], "--tcp"),
                          (["--pause", "-1"], "--pause -1"), (["--gaps", "2"], "'2' is invalid"),
                          (["--gaps", "0,0,0"], "'0,0,0' is invalid"),
                          (["--compute", "-1"], "--compute -1"),
                          (["--leads", "0,x"], "'0,x' is invalid")):
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and culprit in err[-1], err


@pytest.mark.slow
def test_two_real_workers_burst_and_both_report(bench, tmp_path):
    """Two bursts on the one-machine cluster under this machine's TCP, the links sampled: both workers'
    answers come back (nine 2 MiB push_pulls each, both ways through one 200 Mbit/s server link: at
    least 1.5 s), worker 1 sends part of the bytes after it starts, and the simulator's equal shares
    finish both workers together."""
    tcp = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    out = tmp_path / "shares.json"
    assert bench.main(["--tcp", tcp, "--reps", "1", "--leads", "0,0.3", "--clusters", "1", "--rates", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["tcp"][tcp]
    bursts = result["clusters"][0]["bursts"]
    assert [b["lead"] for b in bursts] == [0, 0.3] and bursts[1]["lead_s"] == pytest.approx(0.3, abs=0.1)
    for burst in bursts:
        assert all(1.5 < t < 10 for t in burst["last_s"]) and math.isfinite(burst["last_later_s"])
        assert 0.2 < burst["sent_shares"][1] < 0.8  # both push through the server's one link
        assert all(sent > 1000 and 0 <= retransmitted < sent for sent, retransmitted in burst["segments"])
    simulated = result["simulated"]
    assert simulated["0"]["last_s"][0] == simulated["0"]["last_s"][1] and 2.5 < simulated["0"]["last_s"][0] < 4
    assert simulated["0.3"]["first_s"][0] < simulated["0"]["first_s"][0]  # a lead's first answer comes sooner
