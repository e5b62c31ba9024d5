"""Compute cost model: how long each layer's forward and backward take on a named device.

Per tensor (forward order) and per pass, for a batch of ``B`` samples::

    t = B * max(flops / (peak_flops * efficiency), bytes / (mem_bw * mem_efficiency)) + launch_s

``flops`` and ``bytes`` are the tensor's per-sample FLOPs and activation memory traffic from the zoo
(:mod:`byteps_prophet.sim.zoo`). The first term is the usual FLOPs / (peak x efficiency); the
second keeps memory-bound layers (BatchNorm, ReLU, LayerNorm, softmax), whose FLOPs are tiny, from
costing nothing, as a roofline would. ``launch_s`` is the fixed cost of issuing the layer's kernel
(framework dispatch + launch), paid once per tensor per pass whatever the batch.

Device numbers are vendor peaks (datasheets) times efficiencies chosen so that the model lands on
commonly reported single-GPU training speeds (ResNet-50 FP32 on a V100 at batch 32: about 100 ms
per iteration, ~330 images/s; VGG-16: 200-250 ms). They are a model, not a measurement; a recorded
profile (:mod:`byteps_prophet.profile`) replaces them with real timings.

=======  ==========  ===============  ===========  =====  =========  ========
device   FP32 peak   FP16 peak        memory BW    eff.   mem. eff.  launch
=======  ==========  ===============  ===========  =====  =========  ========
v100     15.7 TF/s   125 TF/s (TC)    900 GB/s     0.85   0.80       5 us
a100     19.5 TF/s   312 TF/s (TC)    1555 GB/s    0.85   0.80       5 us
h100     67 TF/s     989 TF/s (TC)    3350 GB/s    0.70   0.80       4 us
cpu      1.0 TF/s    1.0 TF/s         100 GB/s     0.50   0.60       20 us
=======  ==========  ===============  ===========  =====  =========  ========

Sources: NVIDIA Tesla V100 SXM2 datasheet (15.7 FP32, 125 tensor, 900 GB/s HBM2); A100 SXM4 40 GB
datasheet (19.5 FP32, 312 FP16 tensor dense, 1,555 GB/s); H100 SXM5 datasheet (67 FP32, 989 FP16
tensor dense, 3.35 TB/s HBM3). ``cpu`` is a nominal server socket: 16 cores x 2 AVX-512 FMA units
x 16 lanes x 2 FLOPs x ~1 GHz sustained AVX-512 clock ~= 1 TF/s, six DDR4-2666 channels ~= 128 GB/s
peak (100 GB/s used). FP32 uses the plain FP32 peak (no TF32). ``precision="fp16"`` (mixed
precision) uses the tensor-core peak at ``tensor_efficiency`` (tensor cores rarely run near peak in
training: 0.30 on the GPUs) and halves the activation bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from byteps_prophet.errors import UserError
from byteps_prophet.sim.zoo import ModelSpec

PRECISIONS = ("fp32", "fp16")


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_fp32: float  # FLOP/s, vendor peak
    peak_fp16: float  # FLOP/s, vendor peak (tensor cores where the device has them)
    mem_bw: float  # bytes/s, vendor peak
    efficiency: float  # fraction of peak_fp32 reached by dense layers
    tensor_efficiency: float  # fraction of peak_fp16 reached by dense layers in mixed precision
    mem_efficiency: float  # fraction of mem_bw reached by memory-bound layers
    launch_s: float  # fixed cost per tensor per pass (kernel dispatch and launch), seconds

    def __post_init__(self) -> None:
        for field in ("peak_fp32", "peak_fp16", "mem_bw"):
            if not getattr(self, field) > 0:
                raise UserError(f"device {self.name!r}: {field} must be > 0, got {getattr(self, field)}")
        for field in ("efficiency", "tensor_efficiency", "mem_efficiency"):
            if not 0 < getattr(self, field) <= 1:
                raise UserError(f"device {self.name!r}: {field} must be in (0, 1], got {getattr(self, field)}")
        if not self.launch_s >= 0:
            raise UserError(f"device {self.name!r}: launch_s must be >= 0, got {self.launch_s}")


TF, GB = 1e12, 1e9
DEVICES: dict[str, DeviceSpec] = {
    "v100": DeviceSpec("v100", 15.7 * TF, 125 * TF, 900 * GB, 0.85, 0.30, 0.80, 5e-6),
    "a100": DeviceSpec("a100", 19.5 * TF, 312 * TF, 1555 * GB, 0.85, 0.30, 0.80, 5e-6),
    "h100": DeviceSpec("h100", 67 * TF, 989 * TF, 3350 * GB, 0.70, 0.30, 0.80, 4e-6),
    "cpu": DeviceSpec("cpu", 1.0 * TF, 1.0 * TF, 100 * GB, 0.50, 0.50, 0.60, 20e-6),
}
DEFAULT_DEVICE = "v100"


@dataclass(frozen=True)
class LayerTimes:
    """Per-tensor compute times in seconds, forward order (index 0 = first layer).

    ``bwd_s[i]`` is the backward work that ends with tensor i's gradient being ready; backward runs
    from the last index to index 0, so tensor i's gradient is ready ``sum(bwd_s[i:])`` after the
    backward pass starts.
    """

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.fwd_s) != len(self.bwd_s):
            raise UserError(f"LayerTimes: fwd_s has {len(self.fwd_s)} entries but bwd_s has {len(self.bwd_s)}")

    @property
    def fwd_total(self) -> float:
        return sum(self.fwd_s)

    @property
    def bwd_total(self) -> float:
        return sum(self.bwd_s)

    @property
    def total(self) -> float:
        """Compute time of one iteration (forward + backward), seconds."""
        return self.fwd_total + self.bwd_total

    def ready_times(self) -> tuple[float, ...]:
        """Each tensor's gradient ready time, seconds after backward start, forward order."""
        out = [0.0] * len(self.bwd_s)
        t = 0.0
        for i in range(len(self.bwd_s) - 1, -1, -1):
            t += self.bwd_s[i]
            out[i] = t
        return tuple(out)

    def scaled(self, factor: float) -> "LayerTimes":
        """All times multiplied by ``factor`` (a slower or faster device)."""
        if not factor > 0:
            raise UserError(f"LayerTimes.scaled: factor must be > 0, got {factor}")
        return LayerTimes(tuple(t * factor for t in self.fwd_s), tuple(t * factor for t in self.bwd_s))


def get_device(device: str) -> DeviceSpec:
    """The device called ``device`` (case-insensitive)."""
    key = device.strip().lower() if isinstance(device, str) else None
    if key not in DEVICES:
        raise UserError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    return DEVICES[key]


def compute_times(model: ModelSpec, batch: int, device: str = DEFAULT_DEVICE,
                  precision: str = "fp32") -> LayerTimes:
    """Forward and backward time of each tensor's layer for ``batch`` samples on ``device``."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UserError(f"batch must be a positive integer, got {batch!r}")
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    dev = get_device(device)
    if precision == "fp32":
        flop_rate, byte_scale = dev.peak_fp32 * dev.efficiency, 1.0
    else:
        flop_rate, byte_scale = dev.peak_fp16 * dev.tensor_efficiency, 0.5
    byte_rate = dev.mem_bw * dev.mem_efficiency

    def one(flops: float, nbytes: float) -> float:
        return batch * max(flops / flop_rate, nbytes * byte_scale / byte_rate) + dev.launch_s

    fwd = tuple(one(t.fwd_flops, t.fwd_bytes) for t in model.tensors)
    bwd = tuple(one(t.bwd_flops, t.bwd_bytes) for t in model.tensors)
    return LayerTimes(fwd, bwd)
