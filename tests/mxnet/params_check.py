"""Shared by the multi-process MXNet tests: every worker's parameters against the expected ones, and
a failed run's report."""
import numpy as np


MOVED = 1e-4  # one SGD step of these tests moves every parameter by 1.3e-3 or more; weight decay alone by < 1e-6


def assert_every_parameter_trained(trained: dict, initial: dict, what: str = "") -> None:
    """Every parameter moved from its initial value by more than weight decay alone would move it
    (a non-zero value is no evidence of training: Xavier gives one before any step; nor is a change
    of 1e-5, which zero gradients give under weight decay)."""
    assert trained.keys() == initial.keys(), what
    moved = {k: float(np.abs(trained[k] - initial[k]).max()) for k in trained}
    still = {k: v for k, v in moved.items() if v <= MOVED}
    assert not still, f"{what}: not trained (largest change per parameter): {still}"


def assert_every_worker_equals(expected: dict, per_worker: list[dict], initial: dict, atol: float = 1e-6) -> None:
    """Every worker ends with ``expected``, and ``expected`` is trained (differs from ``initial``)."""
    assert_every_parameter_trained(expected, initial, "expected")
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
