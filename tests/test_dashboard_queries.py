"""tests/dashboard_queries.py's rendering, the parts that need no data
source: Grafana's variable formats and escaping, its interval rounding and
$__rate_interval, and annotation titles. The live tests
(tests/test_dashboards.py, the lab) run the rest against real servers."""

import pytest

from dashboard_queries import (
    Dashboard,
    duration,
    format_values,
    label_format,
    round_interval_ms,
)

VALUES = ["xfer-a", "host.b", "c/d"]


@pytest.mark.parametrize(
    "fmt, source, want",
    [
        (None, "prometheus", r"(xfer-a|host\\.b|c/d)"),
        (None, "influxdb", r"(xfer-a|host\.b|c\/d)"),
        ("csv", "prometheus", "xfer-a,host.b,c/d"),
        ("pipe", "prometheus", "xfer-a|host.b|c/d"),
        ("json", "prometheus", '["xfer-a","host.b","c/d"]'),
        ("doublequote", "influxdb", '"xfer-a","host.b","c/d"'),
        ("singlequote", "influxdb", "'xfer-a','host.b','c/d'"),
        ("glob", "prometheus", "{xfer-a,host.b,c/d}"),
        ("text", "prometheus", "xfer-a + host.b + c/d"),
        ("regex", "prometheus", r"(xfer-a|host\.b|c\/d)"),
        ("percentencode", "prometheus", "%7Bxfer-a%2Chost.b%2Cc%2Fd%7D"),
    ],
)
def test_multi_value_formats(fmt, source, want):
    assert format_values(VALUES, fmt, source, multi=True) == want


def test_all_renders_the_all_value_and_single_values_their_own_escaping():
    assert format_values(VALUES, None, "prometheus", multi=True, all_value=".+") == ".+"
    assert format_values(VALUES, "csv", "prometheus", multi=True, all_value=".+") == (
        "xfer-a,host.b,c/d"
    )
    assert format_values(["a.b"], None, "prometheus", multi=True) == r"a\\.b"
    assert format_values(["it's"], None, "prometheus", multi=False) == r"it\\'s"
    with pytest.raises(AssertionError, match="lucene"):
        format_values(VALUES, "lucene", "prometheus", multi=True)


@pytest.mark.parametrize(
    "ms, want",
    [(60, 50), (900, 1000), (14_000, 15_000), (40_000, 30_000), (100_000, 120_000)],
)
def test_interval_rounding(ms, want):
    assert round_interval_ms(ms) == want


def test_interval_and_rate_interval_of_a_range():
    """$__interval: the range over the max data points, rounded, at least the
    data source's minimum; $__rate_interval: max($__interval + scrape, 4 x
    scrape)."""
    board = {"title": "t", "templating": {"list": []}}
    lab = Dashboard(board, None, 0, 900, scrape_s=5, influx_min_s=15)
    assert (duration(lab.interval_ms("prometheus")), duration(lab.rate_interval_ms())) == (
        "5s",
        "20s",
    )
    assert lab.macros("influxdb")["__interval"] == "15s"
    assert lab.macros("influxdb")["timeFilter"] == "time >= 0ms and time <= 900000ms"
    day = Dashboard(board, None, 0, 86400, scrape_s=5, influx_min_s=15)
    assert day.macros("prometheus")["__interval"] == "1m"
    assert day.rate_interval_ms() == 65000 and day.macros("prometheus")["__rate_interval"] == "65s"


def test_annotation_titles_take_the_series_labels():
    assert label_format("{{campaign}}: run {{ run }}", {"campaign": "fig5", "run": "a"}) == (
        "fig5: run a"
    )
