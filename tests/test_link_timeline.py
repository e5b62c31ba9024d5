"""scripts/link_timeline.py idle: the server link's busy and idle time over a trace's steps."""
import json
import subprocess
import sys
from pathlib import Path

from byteps_prophet.core.trace import TraceLog

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "link_timeline.py"


def test_idle_time_and_busy_rate_of_the_servers_ingress(tmp_path):
    log = TraceLog(0, "rank 0")
    for k in range(6):  # steps every second from t = 100 s: the measured span is 102-105 s
        log.instant("step", "step", 100.0 + k, iteration=k)
    trace = tmp_path / "prophet_r0.trace.json"
    log.save(str(trace), {})
    samples = tmp_path / "samples.jsonl"
    rows = [json.dumps({"devs": ["worker-0", "server-0"]})]
    pushed = pulled = 0
    for i in range(1000 * 8):  # every 1 ms from 99 s: pushes at 25 MB/s in the first half of each second
        t = 99.0 + i / 1000
        if (t % 1.0) < 0.5:
            pushed += 25_000
        pulled += 5_000 if (t % 1.0) < 0.9 else 0
        rows.append(json.dumps([t, 0, 0, pulled, pushed]))  # per port: rx, tx
    samples.write_text("\n".join(rows) + "\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "idle", str(samples), str(trace)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "ingress 12.50 MB/s" in out and "ingress idle 50%" in out, out
    assert "both idle 10%" in out and "median 25.00 MB/s" in out, out
    assert out.count("both idle 0.10 s") == 3, out  # 0.9-1.0 of each of the three seconds


def test_a_missing_port_is_a_one_line_error(tmp_path):
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"devs": ["worker-0"]}) + "\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "idle", str(samples), "x.json"], capture_output=True, text=True)
    assert proc.returncode == 2 and "no port 'server-0'" in proc.stderr and "Traceback" not in proc.stderr
