"""A real calibration on the cheapest engine (gloo), on a shaped namespace cluster."""
import json
import subprocess
import sys

import pytest

from byteps_prophet.core.traits import load_engine


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gloo_calibration_measures_the_shaped_link(tmp_path):
    from byteps_prophet.cluster import netns

    if netns.unavailable_reason():
        pytest.skip(f"needs network namespaces: {netns.unavailable_reason()}")
    out = tmp_path / "engine_gloo.json"
    proc = subprocess.Popen([sys.executable, "-m", "byteps_prophet", "calibrate", "--backend", "gloo",
                             "--bandwidth", "200mbit", "--out", str(out), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=280)
    assert proc.returncode == 0, stderr[-2000:]
    assert "calibrate: back-to-back groups done" in stderr  # progress on stderr
    traits = load_engine(str(out))
    assert traits.name == "gloo" and traits.stages == 1 and not traits.pulls_follow_pushes
    assert traits.bandwidth_bytes_per_s == pytest.approx(200e6 / 8, rel=0.30)
    assert traits.compute_slowdown >= 1.0 and traits.message_cost_s < 0.05
    printed = json.loads(stdout.strip().splitlines()[-1])
    assert printed["traits"] == traits.to_dict() and printed["measured"]["raw"]["stream"]
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{netns.PREFIX}-{proc.pid}-" not in leftovers  # its cluster's namespaces are gone


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kvstore_calibration_tells_the_pull_in_the_reply_from_a_pull_request(tmp_path):
    """The real MXNet dist_sync store on a shaped cluster: a small op issued just before a large one
    waits for the large push when it is a push and a pull (its pull request queues behind it), not when
    it is one pushpull (the server's answer carries the values): pull in reply, with a burst duplex
    efficiency fitted from the pushpull bursts."""
    from byteps_prophet.cluster import netns

    if netns.unavailable_reason():
        pytest.skip(f"needs network namespaces: {netns.unavailable_reason()}")
    out = tmp_path / "engine_kvstore.json"
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", "calibrate", "--backend", "kvstore",
                           "--bandwidth", "300mbit", "--out", str(out)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    traits = load_engine(str(out))
    derived = json.loads(out.read_text())["measured"]["derived"]
    assert traits.pulls_follow_pushes and derived["behind_extra_s"] > 0.5 * derived["big_push_s"], derived
    assert traits.pull_in_reply and derived["reply_behind_extra_s"] < 0.5 * derived["big_push_s"], derived
    assert len(derived["reply_streams"]) == 16 and 0.5 <= traits.duplex_efficiency <= 1.0
