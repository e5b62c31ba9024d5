"""The PyTorch plugin: ``DistributedOptimizer`` (drop-in for ``byteps.torch.DistributedOptimizer``),
scheduled by FIFO, ByteScheduler or Prophet (``BYTEPS_SCHEDULER``). See docs/PYTORCH.md."""
from byteps_prophet.torch.compression import Compression
from byteps_prophet.torch.optimizer import DistributedOptimizer, broadcast_parameters

__all__ = ["Compression", "DistributedOptimizer", "broadcast_parameters"]
