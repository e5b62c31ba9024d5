"""byteps-prophet: communication scheduling (Prophet, ByteScheduler, FIFO) for BytePS-style training.

The core (``byteps_prophet.core``) is framework-free; framework plugins, backends, the simulator,
the cluster launcher and the CLI build on it.
"""

__version__ = "0.1.0"
