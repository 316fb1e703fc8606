"""Grafana's typed dashboard SDK (grafana-foundation-sdk, pinned in
scripts/requirements.txt), imported once for the whole library, and the two
query kinds its Grafana 10.1 release has no model for, defined as SDK types:
InfluxQL targets (`InfluxQLQuery`) and the Prometheus annotation query's own
fields (`PrometheusAnnotationQuery`), both handed to the SDK through `Built`."""

import sys
import typing

# What the library uses of the SDK, imported here once (with the message below when
# it is missing), and the types and data sources defined here.
__all__ = [
    "common_builder", "dashboard_builder", "prometheus_builder", "stat_builder", "statetimeline_builder",
    "table_builder", "timeseries_builder", "cogbuilder", "cogplugins", "cogvariants", "JSONEncoder", "common",
    "model", "prometheus_model", "InfluxQLQuery", "Built", "PrometheusAnnotationQuery", "PROM", "INFLUX",
]

try:
    from grafana_foundation_sdk.builders import common as common_builder
    from grafana_foundation_sdk.builders import dashboard as dashboard_builder
    from grafana_foundation_sdk.builders import prometheus as prometheus_builder
    from grafana_foundation_sdk.builders import stat as stat_builder
    from grafana_foundation_sdk.builders import statetimeline as statetimeline_builder
    from grafana_foundation_sdk.builders import table as table_builder
    from grafana_foundation_sdk.builders import timeseries as timeseries_builder
    from grafana_foundation_sdk.cog import builder as cogbuilder
    from grafana_foundation_sdk.cog import plugins as cogplugins
    from grafana_foundation_sdk.cog import variants as cogvariants
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus as prometheus_model
except ImportError as error:  # pragma: no cover - the message is the point
    sys.exit(
        "generate.py: grafana-foundation-sdk is not importable (%s): run scripts/setup and use "
        "$LONGHAUL_CACHE/venv/bin/python3 (default /var/cache/longhaul/venv)" % error
    )

# The two data sources, each a dashboard variable (datasource_var).
PROM = model.DataSourceRef(type_val="prometheus", uid="${prometheus_datasource}")
INFLUX = model.DataSourceRef(type_val="influxdb", uid="${influxdb_datasource}")


# --- SDK types the 10.1 release lacks ---------------------------------------------


class InfluxQLQuery(cogvariants.Dataquery):
    """A raw InfluxQL target of Grafana's InfluxDB data source (the query
    editor's raw mode: query, rawQuery, resultFormat, alias)."""

    def __init__(self, query="", alias="", ref_id="A", datasource=None):
        self.query = query
        self.alias = alias
        self.ref_id = ref_id
        self.datasource = datasource
        self.raw_query = True
        self.result_format = "time_series"

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "refId": self.ref_id,
            "query": self.query,
            "rawQuery": self.raw_query,
            "resultFormat": self.result_format,
            "alias": self.alias,
        }
        if self.datasource is not None:
            payload["datasource"] = self.datasource
        return payload


class Built(cogbuilder.Builder[typing.Any]):
    """An SDK builder of a model made here whole (the types above): what the
    SDK's panels and dashboards take as a target or an annotation."""

    def __init__(self, built) -> None:
        self._built = built

    def build(self):
        return self._built


class PrometheusAnnotationQuery(model.AnnotationQuery):
    """An annotation query of Grafana's Prometheus data source: the SDK's
    AnnotationQuery plus the fields Prometheus' annotation support reads
    (step, titleFormat, textFormat, tagKeys, useValueForTime)."""

    def __init__(self, step="", title_format="", text_format="", tag_keys="", **kwargs):
        super().__init__(datasource=PROM, **kwargs)
        self.step = step
        self.title_format = title_format
        self.text_format = text_format
        self.tag_keys = tag_keys
        self.use_value_for_time = False

    def to_json(self) -> dict[str, object]:
        payload = super().to_json()
        payload.update(
            {
                "step": self.step,
                "titleFormat": self.title_format,
                "textFormat": self.text_format,
                "tagKeys": self.tag_keys,
                "useValueForTime": self.use_value_for_time,
            }
        )
        return payload
