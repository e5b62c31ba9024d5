"""Fixtures shared by the test folders."""
from __future__ import annotations

import collections
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SWITCH_RUNS = ("unset", "bytescheduler", "prophet")
BENCHMARKS = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks"


def load_script(name: str):
    """``scripts/benchmarks/<name>.py`` as a module, so that a benchmark's bookkeeping is tested without running it."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its functions pickle by name (bench_sim.py --jobs)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_switch_script():
    """``run(worker, env_for, knobs)``: an unmodified BytePS script (``worker``) on one 2-worker,
    1-server BytePS cluster at 1 Gbit/s, once per BYTEPS_SCHEDULER value in ``SWITCH_RUNS`` (``unset``:
    not set at all, so the caller's ``knobs`` are taken out of this process's environment meanwhile);
    ``env_for(scheduler)`` gives each run's environment. Returns ``{scheduler: RunResult}``."""
    pytest.importorskip("byteps", reason="byteps is not built (scripts/build_byteps.sh)")
    from byteps_prophet.cluster import Cluster, ClusterSpec

    def run(worker: str, env_for, knobs) -> dict:
        runs = {}
        saved = {k: os.environ.pop(k) for k in knobs if k in os.environ}
        try:
            with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="byteps", grace=2.0),
                         output=False) as cluster:
                for scheduler in SWITCH_RUNS:
                    env = env_for(scheduler)
                    if scheduler != "unset":  # nothing else: the cluster tells workers where worker 0 is
                        env["BYTEPS_SCHEDULER"] = scheduler
                    runs[scheduler] = cluster.run([sys.executable, worker], timeout=240, env=env)
        finally:
            os.environ.update(saved)
        return runs

    return run


PERFETTO_FIELDS = ("name", "ph", "ts", "pid", "tid")


def _assert_loads_in_perfetto(path) -> dict:
    """The file is JSON in the trace-event object form with the fields Perfetto's importer needs: every
    event has name, ph, pid, tid (and ts unless it is metadata), complete events a duration >= 0, and
    no two complete events of one thread overlap unless nested. Returns the document."""
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"], path
    threads = collections.defaultdict(list)
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "i", "M"), e
        for field in PERFETTO_FIELDS:
            assert field in e or (field == "ts" and e["ph"] == "M"), (field, e)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            threads[e["pid"], e["tid"]].append((e["ts"], round(e["ts"] + e["dur"], 3)))  # as written: us, 3 places
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index"), e
    for spans in threads.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"{path}: spans overlap without nesting"
            open_ends.append(end)
    names = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in doc["traceEvents"]} <= names, "a thread without a thread_name"
    assert isinstance(doc["metadata"], dict)
    return doc


@pytest.fixture
def perfetto_check():
    """``check(path)``: the trace file loads as Perfetto needs it (see ``_assert_loads_in_perfetto``)."""
    return _assert_loads_in_perfetto
