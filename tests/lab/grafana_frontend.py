"""Grafana's query path as its web frontend drives it, for the lab tests.

Our Grafana build has no frontend (scripts/build-grafana), and Grafana's
backend does not expand dashboard variables or turn annotation query results
into annotations (its frontend does). This module does those parts as the
frontend would, over Grafana's HTTP API: `Dashboard` reads a dashboard as
Grafana serves it, resolves its variables through Grafana (every query
variable's own query must find values in the lab; a multi-value variable is
rendered with every value it found selected, not "All" = .+, which would hide
a panel whose series carry values its variable does not list; a single-value
one with its saved value if found, else the first), and runs panel targets
and annotation queries through /api/ds/query and /api/annotations.
$__rate_interval, $__interval and $timeFilter are left for Grafana to expand.
"""

import re
import urllib.error

MAX_DATA_POINTS = 1000
# The lab scrapes and polls every 5 s: Grafana's smallest useful interval there.
MIN_INTERVAL_MS = 5000

# Grafana's own variables and macros, expanded by Grafana itself.
VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")
GRAFANA_MACRO = re.compile(r"^(__\w+|timeFilter|interval|interval_ms|range|range_s|range_ms)$")


# --- Grafana's query path, as its frontend drives it --------------------------------------


class Dashboard:
    """A dashboard as Grafana serves it, with its variables resolved through Grafana."""

    def __init__(self, lab, uid, start_ms, end_ms):
        self.lab = lab
        self.start_ms, self.end_ms = start_ms, end_ms
        self.model = lab.grafana("/api/dashboards/uid/%s" % uid)["dashboard"]
        self.title = self.model["title"]
        self.datasources = lab.grafana("/api/datasources")
        self.values = {}  # variable name -> the selected values
        self.formats = {}  # variable name -> "prometheus" | "influxdb" (regex) | "plain"
        for variable in self.model.get("templating", {}).get("list", []):
            self.resolve(variable)

    # variables ---------------------------------------------------------------------
    def resolve(self, variable):
        name, kind = variable["name"], variable["type"]
        if kind == "datasource":
            matches = [d["uid"] for d in self.datasources if d["type"] == variable["query"]]
            assert matches, "%s: no %s datasource for $%s" % (self.title, variable["query"], name)
            self.values[name], self.formats[name] = matches[:1], "plain"
        elif kind == "query":
            source = self.datasource(variable["datasource"])
            query = variable["query"]
            query = query.get("query", "") if isinstance(query, dict) else query
            found = self.variable_values(source, self.render(query, source["type"]))
            assert found, "%s: variable $%s has no values (%s)" % (self.title, name, query)
            self.values[name], self.formats[name] = selection(variable, found, source["type"])
        elif kind == "custom":
            self.values[name] = [v.strip() for v in variable["query"].split(",") if v.strip()]
            self.formats[name] = "plain"
        elif kind in ("constant", "textbox"):
            self.values[name], self.formats[name] = [variable["query"]], "plain"
        else:
            raise AssertionError(
                "%s: variable type %s of $%s not handled" % (self.title, kind, name)
            )

    def variable_values(self, source, query):
        if source["type"] == "prometheus":
            match = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", query)
            assert match, "%s: unexpected Prometheus variable query %r" % (self.title, query)
            params = {"start": self.start_ms // 1000, "end": self.end_ms // 1000}
            if match.group(1):
                params["match[]"] = match.group(1).strip()
            answer = self.lab.grafana(
                "/api/datasources/uid/%s/resources/api/v1/label/%s/values"
                % (source["uid"], match.group(2)),
                params=params,
            )
            return sorted(answer["data"])
        if source["type"] == "influxdb":
            frames = self.query(
                {"refId": "V", "query": query, "rawQuery": True, "resultFormat": "table"}, source
            )
            # SHOW TAG VALUES: columns key, value.
            return sorted({row for f in frames for row in f["data"]["values"][-1]})
        raise AssertionError("%s: variables of %s datasources not handled" % (self.title, source))

    def render(self, text, datasource_type):
        """The text with the dashboard's variables in the format of this datasource
        (all their values selected); Grafana's own macros left as they are."""

        def one(match):
            name = next(g for g in (match.group(1), match.group(3), match.group(4)) if g)
            if name in self.values:
                return render_values(self.values[name], self.formats[name], datasource_type)
            if GRAFANA_MACRO.match(name):
                return match.group(0)
            raise AssertionError("%s: unknown variable $%s in %r" % (self.title, name, text))

        return VARIABLE.sub(one, text)

    # queries -----------------------------------------------------------------------
    def datasource(self, reference):
        """The datasource ({uid, type}) a panel or target names, variables resolved."""
        if reference is None:
            default = [d for d in self.datasources if d.get("isDefault")]
            assert default, "%s: a panel without datasource and no default datasource" % self.title
            return {"uid": default[0]["uid"], "type": default[0]["type"]}
        if isinstance(reference, str):  # older dashboards: the datasource's name or a variable
            reference = {"uid": reference}
        uid = self.render(reference.get("uid", ""), "plain")
        found = [d for d in self.datasources if uid in (d["uid"], d["name"])]
        assert found, "%s: datasource %r not in Grafana" % (self.title, reference)
        return {"uid": found[0]["uid"], "type": found[0]["type"]}

    def query(self, target, source):
        """POST /api/ds/query of one target; returns its frames (fails on errors)."""
        span_ms = self.end_ms - self.start_ms
        body = {
            "from": str(self.start_ms),
            "to": str(self.end_ms),
            "queries": [
                dict(
                    target,
                    datasource=source,
                    intervalMs=max(MIN_INTERVAL_MS, span_ms // MAX_DATA_POINTS),
                    maxDataPoints=MAX_DATA_POINTS,
                )
            ],
        }
        try:
            answer = self.lab.grafana("/api/ds/query", body)
        except urllib.error.HTTPError as error:
            raise AssertionError(
                "%s: /api/ds/query answered %s: %s" % (self.title, error.code, error.read()[:2000])
            ) from None
        result = answer["results"][target["refId"]]
        assert "error" not in result, "%s: %s: %s" % (self.title, target, result["error"])
        return result.get("frames", [])

    def targets(self):
        """(panel title, target with variables rendered, its datasource) of every panel."""
        for panel in panels_of(self.model):
            if panel.get("type") == "row":
                continue
            for target in panel.get("targets", []):
                if target.get("hide"):
                    continue
                source = self.datasource(target.get("datasource") or panel.get("datasource"))
                rendered = dict(target)
                for field in ("expr", "query"):
                    if isinstance(rendered.get(field), str):
                        rendered[field] = self.render(rendered[field], source["type"])
                yield panel.get("title", "?"), rendered, source

    # annotations -------------------------------------------------------------------
    def annotations(self):
        """The dashboard's enabled annotation queries."""
        return [
            a for a in self.model.get("annotations", {}).get("list", []) if a.get("enable", True)
        ]

    def prometheus_annotation(self, annotation):
        """A Prometheus annotation query as the frontend runs it: its expr with the
        variables rendered, a range query stepped by at least the annotation's step
        (refId "Anno"). Returns its series, [{"metric": labels, "values": [(s, v)]}];
        the frontend draws an event or region wherever a series has samples."""
        source = self.datasource(annotation["datasource"])
        assert source["type"] == "prometheus", "%s: %s" % (self.title, annotation)
        target = {
            "refId": "Anno",
            "expr": self.render(annotation["expr"], "prometheus"),
            "range": True,
            "instant": False,
            "interval": annotation.get("step", ""),
        }
        series = []
        for frame in self.query(target, source):
            fields, columns = frame["schema"]["fields"], frame["data"]["values"]
            times = next(c for f, c in zip(fields, columns) if f.get("type") == "time")
            for field, column in zip(fields, columns):
                if field.get("type") != "number":
                    continue
                values = [(t / 1000, v) for t, v in zip(times, column) if v is not None]
                series.append({"metric": field.get("labels") or {}, "values": values})
        return series

    def tag_annotations(self, annotation):
        """Grafana's own annotations that an annotation query of its built-in data
        source (type "tags") finds over the time range: /api/annotations with its
        tags, as the frontend asks for them."""
        target = annotation["target"]
        assert target["type"] == "tags", "%s: %s" % (self.title, annotation)
        return self.lab.grafana(
            "/api/annotations",
            params={
                "from": self.start_ms,
                "to": self.end_ms,
                "limit": target.get("limit", 100),
                "tags": target["tags"],
                "matchAny": "true" if target.get("matchAny") else "false",
                "type": "tags",
            },
        )


def panels_of(model):
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def selection(variable, found, fmt):
    """(values, format) of a query variable: every value found for a multi-value
    one; else its saved value if the lab has it, else the first found."""
    if variable.get("multi") or variable.get("includeAll"):
        return found, fmt
    saved = (variable.get("current") or {}).get("value")
    return ([saved] if saved in found else found[:1]), fmt


def render_values(values, fmt, datasource_type):
    """How Grafana renders a variable with these values selected inside a query of
    this datasource type: a regex alternation for multi-value variables."""
    if fmt == "plain" or datasource_type not in ("prometheus", "influxdb"):
        return values[0] if len(values) == 1 else "{%s}" % ",".join(values)
    if datasource_type == "prometheus":
        # inside a PromQL string: a regex escape is a doubled backslash
        escaped = [
            re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), v) for v in values
        ]
    else:
        escaped = [re.sub(r"[$^*{}\[\]+?.()|\\/]", lambda m: "\\" + m.group(0), v) for v in values]
    return "(" + "|".join(escaped) + ")"
