"""Bandwidth and latency strings (tc units) and their errors."""
import pytest
from hypothesis import given, strategies as st

from byteps_prophet.units import format_bandwidth, format_latency, parse_bandwidth, parse_latency
from byteps_prophet.errors import ConfigError, UserError


@pytest.mark.parametrize("text, bits", [
    ("1gbit", 10**9), ("200mbit", 200 * 10**6), ("10Gbit", 10 * 10**9), ("500kbit", 500_000),
    ("1.5gbit", 1_500_000_000), ("8bit", 8), ("1mibit", 2**20), ("1gibit", 2**30),
    ("1mbps", 8_000_000), ("100kbps", 800_000), (" 1 GBIT ", 10**9), (123, 123),
])
def test_bandwidth_units(text, bits):
    assert parse_bandwidth(text) == bits


@pytest.mark.parametrize("text", [None, "none", "unlimited", "off", "", "None"])
def test_bandwidth_unlimited(text):
    assert parse_bandwidth(text) is None


@pytest.mark.parametrize("text, fragment", [
    ("100", "has no unit"),
    ("1gb", "unknown unit 'gb'"),
    ("fast", "is not a rate"),
    ("-1gbit", "is not a rate"),
    ("0mbit", "at least 8bit"),
    ("1e9tbit", "100tbit limit"),
    (0, "must be positive"),
    (True, "is not a rate"),
])
def test_bandwidth_errors_name_the_value_and_the_units(text, fragment):
    with pytest.raises(ConfigError) as err:
        parse_bandwidth(text, "--bandwidth")
    message = str(err.value)
    assert fragment in message
    assert message.startswith("--bandwidth")
    assert "\n" not in message
    assert isinstance(err.value, UserError)


@pytest.mark.parametrize("text, micros", [
    ("1ms", 1000), ("500us", 500), ("0", 0), ("0ms", 0), ("2s", 2_000_000), ("1.5msec", 1500),
    ("250usecs", 250), (None, 0), ("none", 0), (3, 3),
])
def test_latency_units(text, micros):
    assert parse_latency(text) == micros


@pytest.mark.parametrize("text, fragment", [
    ("5", "has no unit"), ("1h", "unknown unit 'h'"), ("soon", "is not a time"),
    ("-1ms", "is not a time"), ("61s", "60s limit"), (-1, "must not be negative"),
])
def test_latency_errors(text, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        parse_latency(text, "--latency")
    assert str(err.value).startswith("--latency")
    assert "s, ms, us" in str(err.value) or "limit" in str(err.value) or "negative" in str(err.value)


@given(st.integers(min_value=8, max_value=10**14))
def test_format_bandwidth_round_trips(bits):
    assert parse_bandwidth(format_bandwidth(bits)) == bits


@given(st.integers(min_value=0, max_value=60_000_000))
def test_format_latency_round_trips(micros):
    assert parse_latency(format_latency(micros)) == micros


def test_format_examples():
    assert format_bandwidth(10**9) == "1gbit"
    assert format_bandwidth(250 * 10**6) == "250mbit"
    assert format_bandwidth(None) == "unlimited"
    assert format_latency(1000) == "1ms"
    assert format_latency(500) == "500us"
