"""The benchmark of each framework, by the A/B's ``--framework`` name."""
from byteps_prophet.ab.workloads import mxnet_bench, torch_bench

BENCHES = {"torch": torch_bench, "mxnet": mxnet_bench}
