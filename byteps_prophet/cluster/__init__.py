"""Local multi-host cluster (network namespaces, tc-shaped links) and the compose-file reader.

Public API (imported lazily, so ``python -m byteps_prophet.cluster.serve`` stays light)::

    from byteps_prophet.cluster import Cluster, ClusterSpec, RunResult
    from byteps_prophet.cluster import parse_bandwidth, parse_latency, load_compose
"""
from __future__ import annotations

_EXPORTS = {
    "Cluster": "local", "ClusterSpec": "local", "Job": "local", "RunResult": "local", "Host": "local",
    "parse_bandwidth": "units", "parse_latency": "units", "format_bandwidth": "units",
    "format_latency": "units", "load_compose": "compose", "default_compose_path": "compose",
    "clean_stale": "netns",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
