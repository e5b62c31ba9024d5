"""The one trace writer (core/trace.py): Chrome trace-event JSON that Perfetto loads."""
import json

import pytest

from byteps_prophet.core.trace import TraceLog, events, load, seconds, trace_path


def test_overlapping_spans_get_their_own_threads_and_the_file_loads(tmp_path, perfetto_check):
    log = TraceLog(3, "rank 3")
    log.instant("ready", "fc.weight", 10.0, iteration=0, index=1, bytes=64)
    log.span("op", "fc.weight", 10.0, 10.5, iteration=0, rows=[0, 2])  # three ops in flight at once
    log.span("op", "fc.weight", 10.1, 10.2, iteration=0, rows=[2, 4])
    log.span("op", "fc.bias", 10.3, 10.9, iteration=0, rows=[0, 1])
    log.span("op", "fc.bias", 11.0, 11.1, iteration=1, rows=[0, 1])  # after all: back on the first thread
    log.span("wait", "forward waits", 10.2, 10.4, track="training", iteration=1)
    path = log.save(str(tmp_path / "t.json"), {"scheduler": "prophet", "world_size": 2})
    doc = perfetto_check(path)
    assert doc["metadata"] == {"scheduler": "prophet", "world_size": 2}
    ops = sorted(events(doc, "op"), key=lambda e: e["ts"])
    assert [e["ts"] for e in ops] == [10.0e6, 10.1e6, 10.3e6, 11.0e6]
    assert [e["dur"] for e in ops] == [0.5e6, 0.1e6, 0.6e6, 0.1e6]
    tids = [e["tid"] for e in ops]
    assert tids[0] != tids[1] and tids[2] not in (tids[0],) and tids[3] == tids[0]
    assert all(e["pid"] == 3 for e in doc["traceEvents"])
    (ready,) = events(doc, "ready")
    assert ready["ph"] == "i" and seconds(ready["ts"]) == 10.0 and ready["args"] == {"iteration": 0, "index": 1,
                                                                                    "bytes": 64}
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"training", "ops", "ops 1"} <= names
    assert load(path)["traceEvents"] == doc["traceEvents"]


def test_where_each_rank_writes():
    assert trace_path("/t/run-{rank}.json", 2, primary=False) == "/t/run-2.json"
    assert trace_path("/t/run.json", 0, primary=True) == "/t/run.json"
    assert trace_path("/t/run.json", 1, primary=False) == "/t/run.rank1.json"
    assert trace_path("/t.d/run", 1, primary=False) == "/t.d/run.rank1"
    # the MXNet leader need not be ps-lite rank 0: the primary keeps the path whatever its rank
    assert trace_path("/t/run.json", 1, primary=True) == "/t/run.json"


@pytest.mark.parametrize("content", ["[1, 2]", "{\"meta\": {}, \"events\": []}", "not json"])
def test_a_file_that_is_not_a_trace_is_one_line(tmp_path, content):
    bad = tmp_path / "x.json"
    bad.write_text(content)
    with pytest.raises(ValueError) as err:
        load(str(bad))
    assert "not a trace file" in str(err.value) and "\n" not in str(err.value)


def test_an_empty_log_is_still_a_trace(tmp_path):
    doc = json.loads(open(TraceLog(0, "rank 0").save(str(tmp_path / "e.json"))).read())
    assert [e["name"] for e in doc["traceEvents"]] == ["process_name"] and doc["metadata"] == {}


def test_step_skews_pair_each_timed_step_with_the_other_workers_nearest():
    """Per timed step of the leader (its last ``steps`` iterations), the other worker's first posted
    gradient less the leader's: how far out of step two workers ran (``simulate --skew``)."""
    from byteps_prophet.core.trace import first_ready, step_skews

    leader, other = TraceLog(0, "rank 0"), TraceLog(1, "rank 1")
    for it, (lead, late) in enumerate([(0.0, 0.9), (2.0, 2.3), (4.0, 4.45), (6.0, 5.8)]):
        for k, t in enumerate((lead, lead + 0.1)):  # the second gradient of a step never counts
            leader.instant("ready", f"g{k}", t, iteration=it)
        other.instant("ready", "g0", late, iteration=it + 7)  # its own numbering: paired by time
    assert first_ready(leader.document()) == {0: 0.0, 1: 2.0, 2: 4.0, 3: 6.0}
    assert step_skews(leader.document(), other.document(), steps=3) == [0.3, 0.45, -0.2]
    assert step_skews(leader.document(), TraceLog(2, "rank 2").document(), steps=3) == []
