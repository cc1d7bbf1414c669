"""The bodies of the lean job endpoints (algorithms, script uploads, metrics, system samples,
logs), for the OpenAPI schema only: those views build their answers as plain dicts
(values_list, no serializers: a chart asks for them on every page load), and these say what
the dicts hold, field by field, so a generated client gets types instead of `dict`.

Never used to serialize; a change to a view's dict needs the same change here
(tests/api/test_typed_responses.py validates real answers against the schema)."""

from __future__ import annotations

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from algorithms.base import HYPERPARAMETER_TYPES

# A hyperparameter's default or choice: its type says which (integer and float values are
# both JSON numbers, so "number" covers them and the three are disjoint for oneOf).
SCALAR = {"oneOf": [{"type": "number"}, {"type": "string"}, {"type": "boolean"}]}
# NaN and ±inf are answered as null (jobs.metrics.finite_or_none, Series.points).
METRIC_VALUE = {"type": "number", "format": "double", "nullable": True}


@extend_schema_field({**SCALAR, "description": "In the hyperparameter's type."})
class ScalarField(serializers.JSONField):
    pass


@extend_schema_field({"type": "array", "items": SCALAR})
class ChoicesField(serializers.JSONField):
    pass


@extend_schema_field({
    "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number", "nullable": True},
    "description": "[step, value]: the step is an integer; the value is null where it was NaN or infinite.",
})
class SeriesPointField(serializers.JSONField):
    pass


@extend_schema_field({
    "type": "array", "minItems": 3, "maxItems": 3,
    "items": {"oneOf": [{"type": "number", "nullable": True}, {"type": "string", "format": "date-time"}]},
    "description": "[step, value, time]: an integer step, the value (null where it was NaN or infinite) and "
                   "its ISO 8601 time.",
})
class RawPointField(serializers.JSONField):
    pass


@extend_schema_field({"type": "object", "additionalProperties": METRIC_VALUE,
                      "description": "Metric name → its rank-0 value at the highest step (null: NaN or infinite)."})
class FinalMetricsField(serializers.JSONField):
    pass


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string", "enum": ["all"]}],
                      "description": "The rank asked for, or \"all\"."})
class RankOrAllField(serializers.JSONField):
    pass


# Named enums (studio.settings ENUM_NAME_OVERRIDES): a bare enum on a property named `source`
# or `type` would share drf-spectacular's component name with every other field of that name,
# and an inline allOf of an enum turned into an object class in openapi-python-client (its logs
# pages failed to parse).
HYPERPARAMETER_TYPE_CHOICES = [(name, name) for name in HYPERPARAMETER_TYPES]
LOG_SOURCE_CHOICES = [("file", "file"), ("stream", "stream")]


# --- GET /api/v1/algorithms/ (algorithms.base.AlgorithmSpec.as_json) -------------------------
class AlgorithmHyperparameterSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=HYPERPARAMETER_TYPE_CHOICES)
    default = ScalarField()
    min = serializers.FloatField(allow_null=True)
    max = serializers.FloatField(allow_null=True)
    choices = ChoicesField(help_text="The allowed values (categorical); empty for the other types.")
    description = serializers.CharField(allow_blank=True)


class AlgorithmAcceptsSerializer(serializers.Serializer):
    label = serializers.BooleanField(help_text="Needs labels: a label column, or class folders.")
    features = serializers.BooleanField(help_text="Needs at least one column besides the label.")
    text_column = serializers.CharField(allow_blank=True, help_text="The hyperparameter naming a text column, or \"\".")
    extensions = serializers.ListField(child=serializers.CharField(), help_text="File extensions it reads (file mode).")


class AlgorithmChannelsSerializer(serializers.Serializer):
    required = serializers.ListField(child=serializers.CharField())
    optional = serializers.ListField(child=serializers.CharField())


class AlgorithmMetricDefinitionSerializer(serializers.Serializer):
    name = serializers.CharField()
    regex = serializers.CharField(help_text="Matched against each line the algorithm prints.")


class AlgorithmObjectiveSerializer(serializers.Serializer):
    metric = serializers.CharField()
    goal = serializers.ChoiceField(choices=["maximize", "minimize"])


class AlgorithmSerializer(serializers.Serializer):
    name = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    formats = serializers.ListField(child=serializers.CharField(), help_text="Dataset formats it reads.")
    accepts = AlgorithmAcceptsSerializer()
    channels = AlgorithmChannelsSerializer()
    distributions = serializers.ListField(child=serializers.CharField())
    hyperparameters = AlgorithmHyperparameterSerializer(many=True)
    metric_definitions = AlgorithmMetricDefinitionSerializer(many=True)
    default_objective = AlgorithmObjectiveSerializer()


class AlgorithmListSerializer(serializers.Serializer):
    """Every built-in algorithm, in one page (next and previous are always null)."""

    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = AlgorithmSerializer(many=True)


# --- POST /api/v1/scripts/ (jobs.scripts.StoredScript) ---------------------------------------
class StoredScriptSerializer(serializers.Serializer):
    uri = serializers.CharField(help_text="Where it is stored: a job's script.uri.")
    entry_point = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes.")
    sha256 = serializers.CharField()
    files = serializers.ListField(child=serializers.CharField())


# --- GET /api/v1/jobs/<id>/metrics/ ----------------------------------------------------------
class MetricSeriesSummarySerializer(serializers.Serializer):
    name = serializers.CharField()
    rank = serializers.IntegerField()
    count = serializers.IntegerField()
    first_step = serializers.IntegerField()
    last_step = serializers.IntegerField()
    last_value = serializers.FloatField(allow_null=True, help_text="The value at last_step; null: NaN or infinite.")


class MetricSeriesListSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    series = MetricSeriesSummarySerializer(many=True)
    final_metrics = FinalMetricsField()


class MetricRankSeriesSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    points = serializers.ListField(child=SeriesPointField())
    total = serializers.IntegerField(help_text="Points in the series (in the step range), before downsampling.")
    downsampled = serializers.BooleanField()


class MetricSeriesSerializer(MetricRankSeriesSerializer):
    name = serializers.CharField()


class MetricSeriesRanksSerializer(serializers.Serializer):
    name = serializers.CharField()
    ranks = MetricRankSeriesSerializer(many=True)


class MetricRawPageSerializer(serializers.Serializer):
    name = serializers.CharField()
    rank = serializers.IntegerField()
    points = serializers.ListField(child=RawPointField())
    next_cursor = serializers.IntegerField(allow_null=True, help_text="The cursor of the next page; null: the last page.")


METRICS_RESPONSE = PolymorphicProxySerializer(
    component_name="JobMetrics",
    serializers=[MetricSeriesListSerializer, MetricSeriesSerializer, MetricSeriesRanksSerializer,
                 MetricRawPageSerializer],
    resource_type_field_name=None,
    many=False,
)


# --- GET /api/v1/jobs/<id>/system-metrics/ ---------------------------------------------------
class SystemSampleSerializer(serializers.Serializer):
    node = serializers.CharField()
    time = serializers.FloatField(help_text="Unix time, seconds.")
    cpu = serializers.FloatField(help_text="Percent.")
    mem = serializers.IntegerField(help_text="Bytes.")
    gpu = serializers.FloatField(allow_null=True, help_text="Percent; null: the node has no GPU.")
    gpu_mem = serializers.IntegerField(allow_null=True, help_text="Bytes; null: the node has no GPU.")


class SystemMetricsSerializer(serializers.Serializer):
    samples = SystemSampleSerializer(many=True)
    truncated = serializers.BooleanField(help_text="True when only the newest samples are listed.")


# --- GET /api/v1/jobs/<id>/logs/ (jobs.metrics.logs.LogPage) ---------------------------------
class LogLineSerializer(serializers.Serializer):
    rank = serializers.IntegerField(help_text="-1: the launcher's own lines.")
    text = serializers.CharField(allow_blank=True)
    time = serializers.FloatField(required=False, allow_null=True,
                                  help_text="Unix time, seconds (live stream lines only).")
    stream = serializers.CharField(required=False, help_text="out or err (live stream lines only).")


class JobLogPageSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    rank = RankOrAllField()
    lines = LogLineSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Send it back as cursor for the next page.")
    cursor_kind = serializers.ChoiceField(choices=["bytes", "stream"],
                                          help_text="bytes: an offset into the file; stream: a stream id.")
    complete = serializers.BooleanField(help_text="The job finished and this page reached the end of its log.")
    source = serializers.ChoiceField(choices=LOG_SOURCE_CHOICES, help_text=(
        "Where the page was read: the uploaded log file, or the live stream before the first upload."))
