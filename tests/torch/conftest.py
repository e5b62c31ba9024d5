import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
pytest.importorskip("torch")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process or cluster test")
