"""The one BytePS transport: an unknown plugin is a one-line error naming the valid ones, before
anything is imported or initialised (the cluster tests in tests/byteps, tests/torch and tests/mxnet
run it on real BytePS from both frameworks)."""
import pytest

from byteps_prophet.backends.byteps_ps import BytePSTransport
from byteps_prophet.errors import ConfigError


def test_an_unknown_plugin_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"BytePS plugin 'tensorflow' is not one; valid: torch, mxnet"):
        BytePSTransport("tensorflow")


def test_round_names_alternate_per_key():
    assert BytePSTransport.round_names(7) == ("bpp.7.0", "bpp.7.1")
