"""Grafana's query behaviour, as Grafana's documentation describes it, run by
our tests against real Prometheus and InfluxDB servers: no Grafana code.

Grafana (AGPL) is not built or run by anything of ours; users run their
vendor's. What a dashboard asks of its data sources is therefore done here,
from Grafana's documented rules, so the dashboards are proven against live
data on loopback (tests/test_dashboards.py) and in the lab during a
campaign (tests/lab/test_dashboards.py, test_alerts.py):

- template variables, in their order: data source variables (the data
  source of their type), query variables (Prometheus `label_values(...)` and
  InfluxQL `SHOW TAG VALUES` queries, run with the variables before them
  rendered), custom and constant ones. "All" renders as the variable's
  `allValue`, or every value found when it has none; `every_value=True`
  selects every value found instead of `allValue` (stricter: a panel whose
  series carry a value its variable does not list shows nothing then); a
  query variable that finds no value fails, unless `allow_empty=True` (a
  value `chosen` for another variable may leave it none);
- rendering a variable into a query: `$var`, `${var}`, `[[var]]` and the
  formats `${var:FORMAT}` (csv, doublequote, glob, json, pipe, raw, regex,
  singlequote, text, percentencode); a multi-value variable in a Prometheus
  query as a regex alternation with Grafana's escaping (a doubled backslash
  inside a PromQL string), in an InfluxQL query as one inside /^...$/;
- the macros: `$__interval` (the range over the panel's max data points,
  rounded as Grafana rounds intervals, at least the data source's minimum
  interval), `$__interval_ms`, `$__rate_interval` (max($__interval + the
  scrape interval, 4 x the scrape interval)), `$__range`, `$__range_s`,
  `$__range_ms`, `$__from`, `$__to`, and InfluxQL's `$timeFilter`;
- panel targets: a Prometheus range query stepped by `$__interval`, or an
  instant query at the range's end; an InfluxQL query as written;
- Prometheus annotation queries: a range query stepped by the annotation's
  `step`, each series' samples merged into regions where they are no more
  than a step apart, titled by `titleFormat` ({{label}}), as Grafana draws
  them.

`sources` is anything with promql(expr, at=None), prom_range(expr, start,
end, step), prom_label_values(label, match, start, end) and influxql(query):
tests/stack.py's Stack and tests/lab/labkit.py's Lab.
"""

import json
import math
import re
import urllib.parse
from pathlib import Path

DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards"

# The data points a panel asks for: Grafana's follows the panel's width in
# pixels; 1000 is a wide panel's.
MAX_DATA_POINTS = 1000
VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)(?::(\w+))?\]\]")

# Grafana's interval rounding (rangeutil.roundInterval): an interval below
# the first bound becomes the second value.
ROUNDING_MS = [
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (1050000, 600000),
    (1500000, 900000),
    (2700000, 1200000),
    (5400000, 1800000),
    (9000000, 3600000),
    (16200000, 7200000),
    (32400000, 10800000),
    (86400000, 21600000),
    (604800000, 86400000),
    (1814400000, 604800000),
    (3628800000, 2592000000),
]


def load_dashboards(directory=DASHBOARDS):
    """{file name: dashboard} of every dashboard JSON in the directory."""
    return {p.name: json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))}


def panels_of(board):
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def round_interval_ms(ms):
    for bound, value in ROUNDING_MS:
        if ms < bound:
            return value
    return 31536000000


def duration(ms):
    """Grafana's text of an interval: 2s, 500ms, 1m, 1h."""
    for unit, size in (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return "%d%s" % (ms // size, unit)
    return "%dms" % ms


def parse_duration_s(text):
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    assert match, "not a duration: %r" % text
    return (
        float(match.group(1))
        * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    )


# --- rendering variables, as Grafana formats them ------------------------------------


def prometheus_regex_escape(value):
    """Grafana's escaping of one value of a multi-value variable inside a PromQL
    string: regex metacharacters escaped, the backslash doubled for the string."""
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), value)


def influx_regex_escape(value):
    """One value inside an InfluxQL /^...$/ regex (the slash escaped too)."""
    return re.sub(r"[$^*{}\[\]+?.()|\\/]", lambda m: "\\" + m.group(0), value)


def format_values(values, fmt, source_type, multi, all_value=None):
    """A variable's selected values as Grafana renders them in a query of
    `source_type`; `fmt` is the ${var:FORMAT} format or None; `all_value`
    the allValue text when "All" is selected and the variable has one."""
    if all_value is not None and fmt in (None, "raw", "regex"):
        return all_value
    if fmt == "raw":
        return ",".join(values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "pipe":
        return "|".join(values)
    if fmt == "json":
        return json.dumps(values, separators=(",", ":"))
    if fmt == "doublequote":
        return ",".join('"%s"' % v.replace('"', '\\"') for v in values)
    if fmt == "singlequote":
        return ",".join("'%s'" % v.replace("'", "\\'") for v in values)
    if fmt == "glob":
        return values[0] if len(values) == 1 else "{%s}" % ",".join(values)
    if fmt == "text":
        return " + ".join(values)
    if fmt == "percentencode":
        return urllib.parse.quote(
            values[0] if len(values) == 1 else "{%s}" % ",".join(values), safe=""
        )
    if fmt == "regex":
        escaped = [re.sub(r"[\\^$.|?*+()\[\]{}/]", lambda m: "\\" + m.group(0), v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(%s)" % "|".join(escaped)
    assert fmt is None, "variable format %r is not one the harness knows" % fmt
    if source_type == "prometheus":
        if not multi:
            return values[0].replace("\\", "\\\\").replace("'", "\\\\'")
        escaped = [prometheus_regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(%s)" % "|".join(escaped)
    if source_type == "influxdb":
        if not multi:
            return values[0]
        escaped = [influx_regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(%s)" % "|".join(escaped)
    return values[0] if len(values) == 1 else "{%s}" % ",".join(values)


# --- a dashboard against real data sources ------------------------------------------------------


class Dashboard:
    """One dashboard over [start, end] (Unix seconds), its variables resolved
    against `sources`. scrape_s: the Prometheus data source's scrape
    interval (its timeInterval); influx_min_s: the InfluxDB data source's
    minimum interval."""

    def __init__(
        self,
        board,
        sources,
        start,
        end,
        scrape_s,
        influx_min_s,
        every_value=False,
        chosen=None,
        allow_empty=False,
        max_data_points=MAX_DATA_POINTS,
    ):
        self.board, self.sources = board, sources
        self.title = board.get("title", "?")
        self.start, self.end = start, end
        self.scrape_s, self.influx_min_s = scrape_s, influx_min_s
        self.every_value = every_value
        self.allow_empty = allow_empty
        self.max_data_points = max_data_points
        # name -> {"values": [...], "multi": bool, "all": allValue or None, "type": ...}
        self.variables = {}
        self.found = {}  # name -> values its own query found
        chosen = chosen or {}
        for variable in board.get("templating", {}).get("list", []):
            self.resolve(variable, chosen.get(variable["name"]))

    # macros ------------------------------------------------------------------------
    def interval_ms(self, source_type):
        """$__interval of a panel of this data source, in ms."""
        span_ms = (self.end - self.start) * 1000
        minimum = self.scrape_s if source_type == "prometheus" else self.influx_min_s
        return max(round_interval_ms(span_ms / self.max_data_points), int(minimum * 1000))

    def rate_interval_ms(self):
        """$__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
        scrape_ms = int(self.scrape_s * 1000)
        return max(self.interval_ms("prometheus") + scrape_ms, 4 * scrape_ms)

    def macros(self, source_type):
        interval = self.interval_ms(source_type)
        span_ms = int((self.end - self.start) * 1000)
        macros = {
            "__interval": duration(interval),
            "__interval_ms": str(interval),
            "__rate_interval": duration(self.rate_interval_ms()),
            "__range": duration(span_ms // 1000 * 1000 or 1000),
            "__range_s": str(span_ms // 1000),
            "__range_ms": str(span_ms),
            "__from": str(int(self.start * 1000)),
            "__to": str(int(self.end * 1000)),
        }
        if source_type == "influxdb":
            time_filter = "time >= %dms and time <= %dms" % (self.start * 1000, self.end * 1000)
            macros["timeFilter"] = macros["__timeFilter"] = time_filter
        return macros

    # variables ------------------------------------------------------------------------
    def resolve(self, variable, chosen):
        name, kind = variable["name"], variable["type"]
        multi = bool(variable.get("multi") or variable.get("includeAll"))
        if kind == "datasource":
            self.variables[name] = {"values": [variable["query"]], "multi": False, "all": None}
            return
        if kind == "query":
            source_type = variable["datasource"]["type"]
            query = variable["query"]
            query = query.get("query", "") if isinstance(query, dict) else query
            found = self.variable_values(source_type, self.render(query, source_type))
            # A chosen value elsewhere may leave a variable with none (Grafana
            # then selects "", or the allValue of "All").
            assert found or self.allow_empty, "%s: variable $%s has no values (%s)" % (
                self.title,
                name,
                query,
            )
        elif kind == "custom":
            found = [v.strip() for v in variable["query"].split(",") if v.strip()]
        elif kind in ("constant", "textbox"):
            found = [variable["query"]]
        else:
            raise AssertionError(
                "%s: variable type %s of $%s not handled" % (self.title, kind, name)
            )
        self.found[name] = found
        current = (variable.get("current") or {}).get("value")
        all_selected = current in ("$__all", ["$__all"]) and variable.get("includeAll")
        if chosen is not None:
            values, all_value = (
                list(chosen) if isinstance(chosen, (list, tuple)) else [chosen]
            ), None
        elif all_selected:
            values = found or [""]
            all_value = None if self.every_value else variable.get("allValue") or None
        else:
            saved = current if isinstance(current, list) else [current]
            values = [v for v in saved if v in found] or found[:1] or [""]
            all_value = None
        self.variables[name] = {"values": values, "multi": multi, "all": all_value}

    def variable_values(self, source_type, query):
        if source_type == "prometheus":
            match = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", query)
            assert match, "%s: unexpected Prometheus variable query %r" % (self.title, query)
            selector = (match.group(1) or "").strip() or None
            return sorted(
                self.sources.prom_label_values(match.group(2), selector, self.start, self.end)
            )
        if source_type == "influxdb":
            # SHOW TAG VALUES: columns key, value.
            return sorted(
                {row[1] for series in self.sources.influxql(query) for row in series["values"]}
            )
        raise AssertionError("%s: variables of %s not handled" % (self.title, source_type))

    def render(self, text, source_type):
        """`text` with the dashboard's variables and Grafana's macros in the
        form a query of this data source type gets them."""
        macros = self.macros(source_type)

        def one(match):
            name = match.group(1) or match.group(3) or match.group(4)
            fmt = match.group(2) or match.group(5)
            if name in self.variables:
                v = self.variables[name]
                return format_values(v["values"], fmt, source_type, v["multi"], v["all"])
            if name in macros:
                return macros[name]
            raise AssertionError("%s: unknown variable $%s in %r" % (self.title, name, text))

        return VARIABLE.sub(one, text)

    # panels --------------------------------------------------------------------------
    def source_type(self, reference):
        """The type of a data source reference ({type, uid} with uid a variable)."""
        if isinstance(reference, dict) and reference.get("type"):
            return reference["type"]
        name = (reference or {}).get("uid", "") if isinstance(reference, dict) else reference
        variable = re.fullmatch(r"\$\{?(\w+)\}?", name or "")
        assert (
            variable and variable.group(1) in self.variables
        ), "%s: data source %r is not a variable" % (self.title, reference)
        return self.variables[variable.group(1)]["values"][0]

    def targets(self):
        """(panel title, target, data source type, rendered query) of every
        visible target of every panel."""
        for panel in panels_of(self.board):
            if panel.get("type") == "row":
                continue
            for target in panel.get("targets", []):
                if target.get("hide"):
                    continue
                source_type = self.source_type(target.get("datasource") or panel.get("datasource"))
                text = target.get("expr") if source_type == "prometheus" else target.get("query")
                yield panel.get("title", "?"), target, source_type, self.render(text, source_type)

    def run_target(self, target, source_type, query, at=None):
        """A target's result: Prometheus series (range, or instant at `at` or
        the end), or InfluxQL series."""
        if source_type == "prometheus":
            if target.get("instant"):
                return self.sources.promql(query, at=self.end if at is None else at)
            step = self.interval_ms("prometheus") / 1000
            return self.sources.prom_range(query, self.start, self.end, step)
        if source_type == "influxdb":
            return self.sources.influxql(query)
        raise AssertionError("%s: targets of %s not handled" % (self.title, source_type))

    # annotations ------------------------------------------------------------------------
    def annotation_queries(self):
        """The enabled annotation queries, by name."""
        return {
            a["name"]: a
            for a in self.board.get("annotations", {}).get("list", [])
            if a.get("enable", True)
        }

    def annotations(self, name):
        """The annotations one Prometheus annotation query draws: its range
        query stepped by the annotation's step (at least $__interval), each
        series' samples merged into regions no more than a step apart.
        [{"labels", "start", "end", "title", "text"}]."""
        annotation = self.annotation_queries()[name]
        source_type = self.source_type(annotation["datasource"])
        assert source_type == "prometheus", "%s: %s" % (self.title, annotation)
        step = max(
            parse_duration_s(annotation.get("step") or "0s"),
            self.interval_ms("prometheus") / 1000,
        )
        expr = self.render(annotation["expr"], "prometheus")
        # Grafana aligns a range query's start to the step.
        start = math.floor(self.start / step) * step
        found = []
        for series in self.sources.prom_range(expr, start, self.end, step):
            times = [float(t) for t, _ in series["values"]]
            first = times[0]
            for before, after in zip(times, times[1:] + [None]):
                if after is None or after - before > step:
                    found.append(
                        {
                            "labels": series["metric"],
                            "start": first,
                            "end": before,
                            "title": label_format(
                                annotation.get("titleFormat", ""), series["metric"]
                            ),
                            "text": label_format(
                                annotation.get("textFormat", ""), series["metric"]
                            ),
                        }
                    )
                    first = after
        return found


def empty_targets(dashboard, instant_at=None):
    """'panel (refId): query' of every target of the dashboard that returns no
    data; instant targets are asked at `instant_at` (default: the range's end)."""
    empty = []
    for title, target, source_type, query in dashboard.targets():
        if result_empty(dashboard.run_target(target, source_type, query, at=instant_at)):
            empty.append("%s: %s (%s): %s" % (dashboard.title, title, target.get("refId"), query))
    return empty


def label_format(template, labels):
    """Grafana's {{label}} legend and annotation formats."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def result_empty(result):
    """True when a query answered no series (or only series without samples)."""
    for series in result:
        if "values" in series and isinstance(series["values"], list):
            if series["values"]:
                return False
        elif "value" in series:
            return False
        elif series:
            return False
    return True
