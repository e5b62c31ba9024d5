"""``byteps-prophet calibrate``: measure an engine's traits on a real cluster (docs/ENGINE.md).

* :mod:`.probe` runs on every worker of a cluster (``python -m byteps_prophet.calibrate.probe``) and
  prints the raw timings of short micro-benchmarks on the real engine (gloo, BytePS, MXNet KVStore);
* :mod:`.fit` turns those timings into :class:`~byteps_prophet.core.traits.EngineTraits` (pure Python);
* :mod:`.cli` starts the cluster, runs the probe and writes the engine profile.
"""
