"""scripts/trace_tails.py on a two-rank trace written here."""
import json
import subprocess
import sys
from pathlib import Path

from byteps_prophet.core.trace import TraceLog

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "trace_tails.py"


def _trace(path, events):
    """Write a trace with the plugins' writer: (kind, iteration, ...) tuples as the torch plugin logs them."""
    log = TraceLog(0, "rank 0")
    for kind, it, *rest in events:
        if kind == "ready":
            log.instant("ready", f"g{rest[0]}", rest[2], iteration=it, index=rest[0], bytes=rest[1])
        elif kind == "eob":
            log.instant("eob", "end of backward", rest[0], iteration=it)
        elif kind == "op":
            submit, done, *more = rest
            index, latency = more if more else (0, 0.05)
            log.span("op", f"g{index}", submit, done, iteration=it, index=index, rows=[0, 1], bytes=1000,
                     submit_ts=submit * 1e6, issue_ts=submit * 1e6, latency_s=latency)
        elif kind == "wait":
            log.span("wait", "forward waits", rest[1], rest[2], track="training", iteration=it, index=rest[0])
    log.save(str(path), {})


def _op(it, submit, done, index=0, latency=0.05):
    return ["op", it, submit, done, index, latency]


def test_tail_is_measured_from_the_slowest_workers_end_of_backward(tmp_path):
    rank0 = tmp_path / "prophet_r0.trace.json"
    # iteration 0: rank 1 ends backward 0.5 s after rank 0; one piece held until 0.7, done at 0.8
    _trace(rank0, [["ready", 0, 1, 1000, 0.0], ["ready", 0, 0, 1000, 1.0], ["eob", 0, 1.0],
                   _op(0, 0.0, 0.2), _op(0, 1.7, 1.8), ["wait", 1, 0, 1.8, 1.9],
                   ["ready", 1, 0, 1000, 2.0], ["eob", 1, 2.0], _op(1, 2.0, 2.1)])
    _trace(tmp_path / "prophet_r0.trace.rank1.json",
           [["ready", 0, 1, 1000, 0.1], ["ready", 0, 0, 1000, 1.5], ["eob", 0, 1.5],
            ["ready", 1, 0, 1000, 2.0], ["eob", 1, 2.05]])
    proc = subprocess.run([sys.executable, str(SCRIPT), str(rank0), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ranks"] == 2
    first, second = result["rows"]
    assert first["backward_s"] == [1.0, 1.4] and first["slowest_after_rank0_s"] == 0.5
    assert first["tail_s"] == 0.3 and first["submitted_after"] == 1
    assert first["next_forward_wait_s"] == [0.1, 0.0]
    assert second["tail_s"] == 0.05 and second["submitted_after"] == 0
    assert result["summary"]["iterations_with_held_pieces"] == 1


def test_at_the_end_of_backward_it_gives_bytes_in_flight_gradient_0_and_the_monitors_latency(tmp_path):
    rank0 = tmp_path / "prophet_r0.trace.json"
    # end of backward at 1.0: g1 (sent 0.5, done 1.3) and g2 (sent 0.9, done 1.2) in flight, g3 done
    # before it; gradient 0 sent at 1.0, done 1.6; the last op issued by then read 0.2 s of latency
    _trace(rank0, [["ready", 0, 0, 1000, 1.0], ["eob", 0, 1.0],
                   _op(0, 0.2, 0.4, 3, 0.1), _op(0, 0.5, 1.3, 1, 0.1), _op(0, 0.9, 1.2, 2, 0.2),
                   _op(0, 1.0, 1.6, 0, 0.3)])
    proc = subprocess.run([sys.executable, str(SCRIPT), str(rank0), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["rows"][0]
    assert row["in_flight_at_eob_bytes"] == 2000  # g1 and g2 (gradient 0 went at that instant, after it)
    assert row["gradient0_after_eob_s"] == 0.6
    assert row["latency_at_eob_s"] == 0.3
    text = subprocess.run([sys.executable, str(SCRIPT), str(rank0)], capture_output=True, text=True).stdout
    assert "in flight MB" in text and " 0.600 " in text


def test_a_file_that_is_not_a_trace_is_a_one_line_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not a trace file" in proc.stderr and "Traceback" not in proc.stderr
