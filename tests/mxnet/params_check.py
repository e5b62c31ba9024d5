"""Shared by the multi-process MXNet tests: every worker's parameters against the expected ones, and
a failed run's report."""
import numpy as np


def assert_every_worker_equals(expected: dict, per_worker: list[dict], atol: float = 1e-6) -> None:
    assert any(np.abs(v).sum() > 0 for v in expected.values())  # training moved something
    for rank, values in enumerate(per_worker):
        assert expected.keys() == values.keys()
        for key in expected:
            np.testing.assert_allclose(values[key], expected[key], rtol=0, atol=atol, err_msg=f"{key} rank {rank}")


def run_report(result, tail: int = 30) -> str:
    """A cluster run as one string for an assertion message (pytest cuts a non-string message to
    about 240 characters, which lost a crashed server's last words in CI): the reason, then the last
    ``tail`` lines of every role, the one that failed first."""
    parts = [result.reason]
    for name in sorted(result.output, key=lambda n: n != result.failed):
        parts.append(f"--- {name} (exit {result.exit_codes.get(name)}):")
        parts.extend(result.output[name][-tail:])
    return "\n".join(parts)
