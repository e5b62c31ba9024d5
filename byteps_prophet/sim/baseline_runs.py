"""Running the simulator's non-scheduler baselines, DDP's buckets and Horovod's fusion (their policies
are sim/baselines.py), and sweeping each over its own knobs.

The simulation builds its scheduler from ``Settings``; a baseline is not one of the schedulers the
settings name, so a run builds the simulation with FIFO and puts the baseline in its place before
anything happens (the simulation reaches its scheduler through ``simulation.scheduler`` for every event).

Variants, keyed as ``simulate --json`` reports them:

* ``ddp``: DistributedDataParallel's defaults (25 MiB buckets, the first 1 MiB);
* ``ddp_best``: the best bucket of ``BUCKET_SWEEP``, widened past its edges (sim/sweeps.py; a fair
  comparison gives DDP its best bucket, as it gives ByteScheduler its best credit);
* ``horovod``: Horovod's defaults (1 ms cycle, 128 MiB fusion buffer);
* ``horovod_best``: the best cycle time and fusion threshold of ``CYCLE_SWEEP`` x ``FUSION_SWEEP``,
  widened the same way.
"""
from __future__ import annotations

from typing import Sequence

from byteps_prophet.core import Settings
from byteps_prophet.sim.baselines import (DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, HOROVOD_CYCLE_S,
                                           HOROVOD_FUSION_BYTES, MIB, DDPBuckets, HorovodFusion)
from byteps_prophet.sim.simulation import Layer, SimulatedCluster, SimResult, Simulation
from byteps_prophet.sim.sweeps import Axis, Sweep, widened_sweep

BASELINE_VARIANTS = {"ddp": ("ddp", "ddp_best"), "horovod": ("horovod", "horovod_best")}
# bucket_cap_mb from a quarter MiB (about one tensor a bucket) to 100 MiB (VGG-16's whole model in two)
BUCKET_SWEEP = tuple(int(mb * MIB) for mb in (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100))
# HOROVOD_CYCLE_TIME around its default, and HOROVOD_FUSION_THRESHOLD from no fusion (0: every gradient
# alone) to its default
CYCLE_SWEEP = (0.25e-3, 1e-3, 2.5e-3, 5e-3)
FUSION_SWEEP = tuple(int(mb * MIB) for mb in (0, 1, 4, 16, 32, 64, 128))


def make_baseline(name: str, simulation: Simulation, bucket_bytes: int = DDP_BUCKET_BYTES,
                  cycle_s: float = HOROVOD_CYCLE_S, fusion_bytes: int = HOROVOD_FUSION_BYTES):
    loop, network, on_done = simulation.loop, simulation.network, simulation.scheduler.on_done
    if name in ("horovod", "horovod_best"):
        baseline = HorovodFusion(loop, network, on_done, cycle_s=cycle_s, fusion_bytes=fusion_bytes)
    elif name in ("ddp", "ddp_best"):
        baseline = DDPBuckets(loop, network, on_done, bucket_bytes=bucket_bytes,
                              first_bucket_bytes=DDP_FIRST_BUCKET_BYTES)
    else:
        raise ValueError(f"baseline {name!r} is unknown; valid: ddp, ddp_best, horovod, horovod_best")
    baseline.on_wakeup = lambda t: loop.at(t, lambda _: baseline.tick())
    return baseline


def simulate_baseline(name: str, layers: Sequence[Layer], cluster: SimulatedCluster, iterations: int = 30,
                      warmup: int = 10, trace_iteration: int | None = None, synchronised: bool = False,
                      **knobs) -> SimResult:
    simulation = Simulation(layers, cluster, Settings(scheduler="fifo"), iterations, warmup, trace_iteration,
                            synchronised)
    simulation.scheduler = make_baseline(name, simulation, **knobs)
    return simulation.run()


def best_bucket(layers: Sequence[Layer], cluster: SimulatedCluster, iterations: int = 30, warmup: int = 10,
                sweep: Sequence[int] = BUCKET_SWEEP, synchronised: bool = False) -> Sweep:
    """DDP's fastest bucket: ``sweep`` widened while the best sits at its edge (sim/sweeps.py), up to
    one bucket holding the whole model; ``best`` is (bucket bytes,)."""
    def time_of(bucket: int) -> float:
        return simulate_baseline("ddp", layers, cluster, iterations, warmup, synchronised=synchronised,
                                 bucket_bytes=bucket).iter_s
    return widened_sweep(time_of, [Axis("bucket", tuple(sweep), lowest=1, highest=sum(layer.nbytes for layer in layers))])


def best_horovod(layers: Sequence[Layer], cluster: SimulatedCluster, iterations: int = 30, warmup: int = 10,
                 cycles: Sequence[float] = CYCLE_SWEEP, fusions: Sequence[int] = FUSION_SWEEP,
                 synchronised: bool = False) -> Sweep:
    """Horovod's fastest (cycle seconds, fusion bytes): ``cycles`` x ``fusions`` widened while the best
    sits at an edge (sim/sweeps.py), the fusion threshold from 0 (no fusion) up to the whole model."""
    def time_of(cycle: float, fusion: int) -> float:
        return simulate_baseline("horovod", layers, cluster, iterations, warmup, synchronised=synchronised,
                                 cycle_s=cycle, fusion_bytes=fusion).iter_s
    return widened_sweep(time_of, [Axis("cycle", tuple(cycles)),
                                   Axis("fusion", tuple(fusions), highest=sum(layer.nbytes for layer in layers))])
