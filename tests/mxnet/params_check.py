"""Shared by the multi-process MXNet tests: every worker's parameters against the expected ones."""
import numpy as np


def assert_every_worker_equals(expected: dict, per_worker: list[dict], atol: float = 1e-6) -> None:
    assert any(np.abs(v).sum() > 0 for v in expected.values())  # training moved something
    for rank, values in enumerate(per_worker):
        assert expected.keys() == values.keys()
        for key in expected:
            np.testing.assert_allclose(values[key], expected[key], rtol=0, atol=atol, err_msg=f"{key} rank {rank}")
