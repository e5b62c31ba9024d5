"""The calibration's micro-benchmarks, run on every worker of a real cluster.

    byteps-prophet cluster run ... -- python -m byteps_prophet.calibrate.probe --backend gloo|byteps|kvstore

Every worker runs the same ops in the same order (collectives and parameter-server keys complete only
when every worker sent them); worker 0 (``DMLC_WORKER_ID=0``) stamps them and prints progress lines
(``#calib ...``) and, at the end, one JSON line ``{"calibration": {...}}`` with the raw timings that
``fit.py`` turns into traits. Phases (each starts from a barrier, a tiny op every worker waits for):

1. warm-up: every buffer synchronised once (BytePS and the KVStore set a key up on its first use);
2. ``stream``: per size, a group of ops issued back to back, then waited for in order; two repetitions;
3. ``alone``: a small, a middle and a large op, each sent onto an idle link (after a pause);
4. ``staggered`` and ``behind`` (parameter servers): a second large op issued once the first's push
   is over; a small op issued just before a large one;
5. ``replies`` (the KVStore): the same small-before-large pair, a large op alone and bursts of large
   and middle ops, each op one ``pushpull`` as the scheduled store sends its atoms (the server
   answers the push with the values; ``fit.py``: pull in reply, and the duplex efficiency of a burst);
   ``windowed`` (BytePS): streams of 1 MB push_pulls with 3 or 6 in flight, as Prophet sends its atoms
   (``fit.py``: the duplex efficiency of a stream whose pushes and pulls overlap);
6. ``compute``: a fixed CPU workload timed alone, then while a background thread keeps the engine moving
   bytes (every worker does both, so the workers' own competition for the cores is in both); and the
   same bytes moved alone, against how long they took beside the workload.

Only the engine's own API is used (``torch.distributed`` all-reduce, ``byteps.torch`` push_pull,
``mx.kv`` push/pull and pushpull), no scheduler: what is measured is the engine.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time

# Tensor sizes of the back-to-back groups, in float32 elements (16 KB .. 2 MB: from a bias to the
# 2 MiB chunk cap, covering the 250 k-element atoms).
SIZES = (4_096, 16_384, 65_536, 262_144, 524_288)
# An all-reduce also fuses collectives of 8 MB and more (DDP's buckets, Prophet's blocks), whose rate
# a fit up to 2 MB does not give; parameter servers send at most 2 MiB chunks.
ALLREDUCE_SIZES = SIZES + (2_097_152,)
GROUP_S = 0.4  # seconds of link time a group aims at
# At least 6 ops a group: a parameter server interleaves a burst of pushes, so its first completion
# comes late and the rest bunch up after it; the slope over 6+ completions is its pull-side service.
MIN_GROUP, MAX_GROUP = 6, 10
REPS = 4  # repetitions of each group: the per-message cost varies from one calibration to the next
ALONE_REPS, BIG_ALONE_REPS, BEHIND_REPS = 6, 3, 3
# The staggered pair decides duplex and its efficiency, a small effect that a few repetitions' noise
# hides: the median of nine.
STAGGER_REPS = 9
# pushpull bursts per size (``replies``): their duplex efficiency varies from burst to burst, so the
# median of several
REPLY_REPS = 5
WINDOWS, WINDOW_OPS, WINDOW_REPS = (2, 4), 12, 3  # the windowed pushpull streams: ops in flight at most, ops
# The windowed push_pull streams (``windowed``, engines without pushpull): 1 MB ops, as Prophet's atoms on
# BytePS, with 3 and 6 in flight (as Prophet keeps several atoms in flight while the big gradients go),
# long enough that both directions of the server's link are busy for most of it; four of each, as one
# stream's time varies with the machine's load.
PUSH_PULL_WINDOWS, PUSH_PULL_WINDOW_OPS, PUSH_PULL_WINDOW_REPS, PUSH_PULL_WINDOW_SIZE = (3, 6), 18, 4, 3
PAUSE_S = 0.05  # idle time before an op that must find the link idle
STAGGER = 1.25  # the second large op of ``staggered``, in push times after the first
COMPUTE_UNIT_S = 0.02
COMPUTE_REPS = 6  # per alone phase
CYCLES = 3  # alone, busy, alone, busy, ...
BUSY_S = 1.5
DEFAULT_RATE = 125e6  # bytes/s assumed when the link is not shaped


def sizes_of(backend: str) -> tuple[int, ...]:
    return ALLREDUCE_SIZES if backend == "gloo" else SIZES


def group_size(link_bytes: float, rate: float) -> int:
    return int(min(MAX_GROUP, max(MIN_GROUP, math.ceil(GROUP_S * rate / link_bytes))))


# -- the engines -----------------------------------------------------------------------------------------
class _ProbedEngine:
    """``start(size_index, slot)`` issues one op on that buffer and returns a handle; ``wait`` blocks."""

    leader = False

    def __init__(self, sizes: tuple[int, ...], counts: list[int]) -> None:
        self.sizes, self.counts = sizes, counts

    def barrier(self) -> None:
        self.wait(self.start(0, 0))


class _Gloo(_ProbedEngine):
    def __init__(self, sizes, counts):
        super().__init__(sizes, counts)
        import torch
        import torch.distributed as dist

        from byteps_prophet.backends.torch_dist import TorchDistBackend

        torch.set_num_threads(1)
        self.backend = TorchDistBackend("gloo")  # the project's rendezvous (RANK, MASTER_ADDR/PORT)
        self.dist = dist
        self.size = self.backend.size
        self.bufs = [[torch.zeros(n) for _ in range(c)] for n, c in zip(sizes, counts)]
        self.torch = torch

    def start(self, si, slot):
        return self.dist.all_reduce(self.bufs[si][slot], async_op=True)

    def wait(self, handle):
        handle.wait()

    def compute_unit(self, reps):
        a = self._a
        for _ in range(reps):
            self.torch.mm(a, a)

    def prepare_compute(self):
        self._a = self.torch.randn(256, 256)

    def close(self):
        self.backend.close()


class _BytePS(_ProbedEngine):
    def __init__(self, sizes, counts):
        super().__init__(sizes, counts)
        import torch

        try:
            import byteps.torch as bps
            import byteps.torch.ops as ops
        except ImportError as err:
            raise SystemExit(f"probe: byteps.torch is not importable ({err}); build it with scripts/build_byteps.sh")
        torch.set_num_threads(1)
        bps.init()
        self.bps, self.ops, self.torch = bps, ops, torch
        self.size = bps.size()
        self.bufs, self.names = [], []
        for si, (n, c) in enumerate(zip(sizes, counts)):
            self.bufs.append([torch.zeros(n) for _ in range(c)])
            self.names.append([f"calib.{si}.{slot}" for slot in range(c)])
            for name in self.names[-1]:
                ops.declare(name)  # same order on every worker: the keys agree

    def start(self, si, slot):
        return self.ops.push_pull_async_inplace(self.bufs[si][slot], average=True, name=self.names[si][slot])

    def wait(self, handle):
        self.ops.synchronize(handle)

    def prepare_compute(self):
        self._a = self.torch.randn(256, 256)

    def compute_unit(self, reps):
        a = self._a
        for _ in range(reps):
            self.torch.mm(a, a)

    def close(self):
        self.bps.shutdown()


class _KVStore(_ProbedEngine):
    def __init__(self, sizes, counts):
        super().__init__(sizes, counts)
        import mxnet as mx

        self.mx = mx
        self.kv = mx.kv.create("dist_sync")
        self.size = self.kv.num_workers
        self.bufs, self.keys = [], []
        key = 0
        for n, c in zip(sizes, counts):
            self.bufs.append([mx.nd.zeros(n) for _ in range(c)])
            self.keys.append(list(range(key, key + c)))
            key += c
        flat_keys = [k for ks in self.keys for k in ks]
        flat_bufs = [b for bs in self.bufs for b in bs]
        self.kv.init(flat_keys, flat_bufs)
        mx.nd.waitall()

    def start(self, si, slot):
        buf, key = self.bufs[si][slot], self.keys[si][slot]
        self.kv.push(key, buf)
        self.kv.pull(key, out=buf)
        return buf

    def wait(self, handle):
        handle.wait_to_read()

    def start_reply(self, si, slot):
        """The op as the scheduled store sends an atom (``mxnet/kvstore.py``): one ``pushpull``, the
        server's answer to the push carrying the merged values (no pull request of its own)."""
        buf, key = self.bufs[si][slot], self.keys[si][slot]
        self.kv.pushpull(key, buf, out=buf)
        return buf

    def prepare_compute(self):
        self._a = self.mx.nd.random.uniform(shape=(256, 256))
        self._a.wait_to_read()

    def compute_unit(self, reps):
        a = self._a
        for _ in range(reps):
            self.mx.nd.dot(a, a).wait_to_read()

    def close(self):
        self.mx.nd.waitall()
        del self.kv


ENGINES = {"gloo": _Gloo, "byteps": _BytePS, "kvstore": _KVStore}


# -- the benchmarks ---------------------------------------------------------------------------------------
class Probe:
    """The calibration's phases (module docstring), one method each, on one engine.

    One class of about 250 lines on purpose: every phase shares the engine, the leader's clock and
    the link factor, and each is a short sequence of issue-and-wait steps; split by phase, the parts
    would pass that state around and the phases would no longer read in the order they run."""

    def __init__(self, engine: _ProbedEngine, *, factor: float, leader: bool) -> None:
        self.e = engine
        self.factor = factor
        self.leader = leader
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, message: str) -> None:
        if self.leader:
            print(f"#calib {message}", flush=True)

    @property
    def big(self) -> int:
        """The index of the largest size."""
        return len(self.e.sizes) - 1

    def link_bytes(self, si: int) -> float:
        return self.e.sizes[si] * 4 * self.factor

    def _group(self, si: int, rep: int, issued: list[float], done: list[float], **extra) -> dict:
        """One group's record: its size, when each op was issued and done."""
        return {"size_index": si, "tensor_bytes": self.e.sizes[si] * 4, "link_bytes": self.link_bytes(si),
                "rep": rep, **extra, "issued": _r(issued), "done": _r(done)}

    def warmup(self) -> None:
        for si, count in enumerate(self.e.counts):
            handles = [self.e.start(si, slot) for slot in range(count)]
            for h in handles:
                self.e.wait(h)
        self.e.barrier()

    def stream(self) -> list[dict]:
        groups = []
        for rep in range(REPS):
            for si in range(len(self.e.counts)):
                self.e.barrier()
                groups.append(self._burst(self.e.start, si, rep))
        return groups

    def _burst(self, start, si: int, rep: int) -> dict:
        """Every slot of size ``si`` issued at once through ``start``; when each was issued and done."""
        issued, handles = [], []
        for slot in range(self.e.counts[si]):
            issued.append(self.now())
            handles.append(start(si, slot))
        done = []
        for h in handles:
            self.e.wait(h)
            done.append(self.now())
        return self._group(si, rep, issued, done)

    def _alone(self, si: int, reps: int) -> list[float]:
        flights = []
        for _ in range(reps):
            self.e.barrier()
            time.sleep(PAUSE_S)
            t = self.now()
            self.e.wait(self.e.start(si, 0))
            flights.append(self.now() - t)
        return flights

    def alone(self) -> dict:
        big, sizes = self.big, self.e.sizes
        return {"small": {"tensor_bytes": sizes[0] * 4, "link_bytes": self.link_bytes(0),
                          "flight_s": _r(self._alone(0, ALONE_REPS))},
                "mid": {"tensor_bytes": sizes[big - 1] * 4, "link_bytes": self.link_bytes(big - 1),
                        "flight_s": _r(self._alone(big - 1, BIG_ALONE_REPS))},
                "big": {"tensor_bytes": sizes[big] * 4, "link_bytes": self.link_bytes(big),
                        "flight_s": _r(self._alone(big, BIG_ALONE_REPS))}}

    def behind(self) -> dict:
        big = self.big
        flights = []
        for _ in range(BEHIND_REPS):
            self.e.barrier()
            time.sleep(PAUSE_S)
            t = self.now()
            small_h = self.e.start(0, 0)
            big_h = self.e.start(big, 0)
            self.e.wait(small_h)
            flights.append(self.now() - t)
            self.e.wait(big_h)
        return {"small_link_bytes": self.link_bytes(0), "big_link_bytes": self.link_bytes(big),
                "flight_s": _r(flights)}

    def staggered(self, alone: dict) -> dict:
        """Two large ops, the second issued a quarter after the first's push should be over (push time:
        half the difference between a large and a small op alone), so that the first's pull request is
        out before the second's push (where pulls follow pushes it would otherwise queue behind it): on
        a duplex link the first's pull overlaps the second's push (both done after about 3.25 one-way
        transfers), on a half-duplex one they take turns (4)."""
        big = self.big
        small_s = sorted(alone["small"]["flight_s"])[len(alone["small"]["flight_s"]) // 2]
        big_s = sorted(alone["big"]["flight_s"])[len(alone["big"]["flight_s"]) // 2]
        delay = STAGGER * max(0.0, (big_s - small_s) / 2)
        flights = []
        for _ in range(STAGGER_REPS):
            self.e.barrier()
            time.sleep(PAUSE_S)
            t = self.now()
            first = self.e.start(big, 0)
            time.sleep(delay)
            second = self.e.start(big, 1)
            self.e.wait(first)
            self.e.wait(second)
            flights.append(self.now() - t)
        return {"link_bytes": self.link_bytes(big), "delay_s": round(delay, 6), "flight_s": _r(flights)}

    def replies(self) -> dict:
        """Where the engine can answer a push with the values (``start_reply``: MXNet's pushpull), the
        same ops as the store sends them: a small op just before a large one (``behind``: does it wait
        for the large push, or only for its own round trip?), a large one alone, and bursts of large and
        middle ops issued at once (``stream``: do the answers flow back while later pushes still go up?
        the gap between completions is then one server-paced push, stretched by what running both
        directions at once costs)."""
        big, mid = self.big, self.big - 1
        start = self.e.start_reply
        behind, alone = [], []
        for _ in range(BEHIND_REPS):
            self.e.barrier()
            time.sleep(PAUSE_S)
            t = self.now()
            small_h = start(0, 0)
            big_h = start(big, 0)
            self.e.wait(small_h)
            behind.append(self.now() - t)
            self.e.wait(big_h)
        for _ in range(BIG_ALONE_REPS):
            self.e.barrier()
            time.sleep(PAUSE_S)
            t = self.now()
            self.e.wait(start(big, 0))
            alone.append(self.now() - t)
        groups = []
        for rep in range(REPLY_REPS):
            for si in (big, mid):
                self.e.barrier()
                time.sleep(PAUSE_S)
                groups.append(self._burst(start, si, rep))
        return {"small_link_bytes": self.link_bytes(0), "big_link_bytes": self.link_bytes(big),
                "behind_s": _r(behind), "big_alone_s": _r(alone), "stream": groups,
                "windowed": self._windowed(start, big, WINDOWS, WINDOW_OPS, WINDOW_REPS)}

    def windowed(self) -> list[dict]:
        """Push_pull ops with a window in flight, as Prophet and a credit send them: pushes and pulls
        overlap for most of the stream (a burst sends every push before the first pull), so how long it
        takes shows what running both directions of the server's link at once costs."""
        return self._windowed(self.e.start, PUSH_PULL_WINDOW_SIZE, PUSH_PULL_WINDOWS, PUSH_PULL_WINDOW_OPS,
                              PUSH_PULL_WINDOW_REPS)

    def _windowed(self, start, si: int, windows, ops: int, reps: int) -> list[dict]:
        """``ops`` ops of one size through ``start``, at most a window of them in flight (the next issued
        as the oldest completes, as a credit does): the same stream as a burst, with a bound on what each
        worker has queued."""
        groups = []
        for rep, window in ((r, w) for r in range(reps) for w in windows):
            self.e.barrier()
            time.sleep(PAUSE_S)
            issued, done, handles = [], [], []
            for slot in range(ops):
                if len(handles) - len(done) >= window:
                    self.e.wait(handles[len(done)])
                    done.append(self.now())
                issued.append(self.now())
                handles.append(start(si, slot % self.e.counts[si]))
            while len(done) < len(handles):
                self.e.wait(handles[len(done)])
                done.append(self.now())
            groups.append(self._group(si, rep, issued, done, window=window))
        return groups

    def compute(self, rate: float) -> dict:
        e = self.e
        e.prepare_compute()
        e.compute_unit(10)
        per = []
        for _ in range(5):
            t = time.monotonic()
            e.compute_unit(10)
            per.append((time.monotonic() - t) / 10)
        reps = max(1, round(COMPUTE_UNIT_S / max(min(per), 1e-6)))
        e.barrier()

        def alone_phase():
            times = []
            for _ in range(COMPUTE_REPS):
                t = time.monotonic()
                e.compute_unit(reps)
                times.append(time.monotonic() - t)
            return times

        big = self.big
        count = e.counts[big]
        rounds = max(1, math.ceil(BUSY_S / CYCLES * rate / (count * self.link_bytes(big))))
        alone, busy, mover_alone, mover_busy = [], [], [], []
        for _ in range(CYCLES):  # alternating: a drift of the machine's load hits both sides alike
            e.barrier()
            alone += alone_phase()
            e.barrier()
            t = time.monotonic()
            self._move(rounds, big, count)
            mover_alone.append(time.monotonic() - t)
            e.barrier()
            computed, moved = self._busy(reps, rounds, big, count)
            busy += computed
            mover_busy.append(moved)
        return {"unit_reps": reps, "alone_s": _r(alone), "busy_s": _r(busy), "mover_rounds": rounds,
                "mover_alone_s": _r(mover_alone), "mover_busy_s": _r(mover_busy), "cycles": CYCLES}

    def _move(self, rounds: int, big: int, count: int) -> None:
        """``rounds`` bursts of ``count`` large ops, each waited for: the mover of the compute phase."""
        for _ in range(rounds):
            handles = [self.e.start(big, slot) for slot in range(count)]
            for h in handles:
                self.e.wait(h)

    def _busy(self, reps: int, rounds: int, big: int, count: int) -> tuple[list[float], float]:
        """Compute units timed while a background thread moves the bytes of ``_move``, and how long
        the moving took beside them."""
        e = self.e
        busy_until = [float("inf")]
        failure: list[BaseException] = []
        started = time.monotonic()

        def move_bytes():
            try:
                self._move(rounds, big, count)
            except BaseException as err:  # noqa: BLE001 - reported by the main thread
                failure.append(err)
            busy_until[0] = time.monotonic()

        mover = threading.Thread(target=move_bytes, name="calib-mover", daemon=True)
        mover.start()
        busy = []
        time.sleep(0.005)
        while mover.is_alive():
            t = time.monotonic()
            e.compute_unit(reps)
            end = time.monotonic()
            if end <= busy_until[0]:
                busy.append(end - t)
        mover.join()
        if failure:
            raise failure[0]
        return busy, busy_until[0] - started


def _r(values):
    return [round(v, 6) for v in values]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m byteps_prophet.calibrate.probe")
    p.add_argument("--backend", required=True, choices=sorted(ENGINES))
    p.add_argument("--rate", type=float, default=0.0, help="the shaped link rate, bytes/s (0: not shaped)")
    args = p.parse_args(argv)
    from byteps_prophet.backends.rendezvous import rendezvous  # the one reader of the topology

    where = rendezvous()
    rank, workers = where.rank_and_size()
    servers = where.num_servers() if args.backend != "gloo" else 0
    leader = rank == 0
    from byteps_prophet.calibrate.fit import link_factor

    factor = link_factor(args.backend, workers, servers)
    rate = args.rate or DEFAULT_RATE
    sizes = sizes_of(args.backend)
    counts = [group_size(n * 4 * factor, rate) for n in sizes]
    started = time.monotonic()
    engine = ENGINES[args.backend](sizes, counts)
    probe = Probe(engine, factor=factor, leader=leader)
    probe.say(f"engine {args.backend} up ({workers} workers, {servers} servers) in {time.monotonic() - started:.1f}s")
    out = {"backend": args.backend, "workers": workers, "servers": servers, "link_factor": factor,
           "sizes": list(sizes), "counts": counts, "nominal_bytes_per_s": args.rate or None}
    probe.warmup()
    probe.say("warm-up done")
    out["stream"] = probe.stream()
    probe.say("back-to-back groups done")
    out["alone"] = probe.alone()
    probe.say("ops alone done")
    if args.backend != "gloo":
        out["staggered"] = probe.staggered(out["alone"])
        probe.say("two large ops staggered by a push done")
        out["behind"] = probe.behind()
        probe.say("small op before a large one done")
        if hasattr(engine, "start_reply"):
            out["replies"] = probe.replies()
            probe.say("pushpull (the answer carries the values) done")
        else:
            out["windowed"] = probe.windowed()
            probe.say("push_pull streams with a window in flight done")
    out["compute"] = probe.compute(rate)
    probe.say("compute alone and while moving bytes done")
    engine.barrier()
    out["elapsed_s"] = round(time.monotonic() - started, 3)
    if leader:
        print(json.dumps({"calibration": out}), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
