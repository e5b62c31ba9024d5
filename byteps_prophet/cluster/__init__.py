"""Local multi-host cluster (network namespaces, tc-shaped links) and the compose-file reader.

Public API (imported lazily, so ``python -m byteps_prophet.cluster.serve`` stays light)::

    from byteps_prophet.cluster import Cluster, ClusterSpec, RunResult
    from byteps_prophet.cluster import parse_bandwidth, parse_latency, load_compose
"""
from __future__ import annotations

_EXPORTS = {
    "Cluster": "local", "ClusterSpec": "local", "Job": "processes", "RunResult": "processes", "Host": "local",
    "parse_bandwidth": "byteps_prophet.units", "parse_latency": "byteps_prophet.units",
    "format_bandwidth": "byteps_prophet.units", "format_latency": "byteps_prophet.units",
    "load_compose": "compose", "default_compose_path": "compose",
    "clean_stale": "netns",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        where = _EXPORTS[name]
        module = importlib.import_module(where if "." in where else f"{__name__}.{where}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
