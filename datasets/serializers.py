from __future__ import annotations

import json

from rest_framework import serializers

from datasets.models import Dataset, DatasetFormat, DatasetVersion
from studio.validators import clean_name
from trainyard.records import parse_split


class DatasetCreateSerializer(serializers.Serializer):
    project = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    source_uri = serializers.CharField(required=False, allow_blank=True, default="", max_length=1024)
    format = serializers.ChoiceField(choices=DatasetFormat.choices, required=False, allow_blank=True, default="")
    label_column = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    text_column = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    delimiter = serializers.CharField(required=False, allow_blank=True, default="", max_length=3, trim_whitespace=False)  # "tab"
    split = serializers.JSONField(required=False, allow_null=True, default=None)

    def validate_name(self, value: str) -> str:
        return clean_name(value)

    def validate_delimiter(self, value: str) -> str:
        if value in ("\\t", "tab"):
            return "\t"
        if value and len(value) != 1:
            raise serializers.ValidationError("A delimiter is one character, e.g. ',' ';' '|' or '\\t'.")
        return value

    def validate_split(self, value):
        if value in (None, "", {}):
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise serializers.ValidationError(f"Not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise serializers.ValidationError('Give ratios per channel, e.g. {"train": 0.8, "validation": 0.2, "seed": 42}.')
        try:
            return parse_split(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate_source_uri(self, value: str) -> str:
        value = value.strip()
        if value and not (value.startswith("s3://") or value.startswith("file://")):
            if value.startswith("/"):
                raise serializers.ValidationError(f"Write server paths as file URIs: file://{value}")
            raise serializers.ValidationError("Use s3://bucket/prefix or file:///path/on/the/server.")
        return value


class VersionSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = DatasetVersion
        fields = ["id", "version", "status", "format", "num_records", "size_bytes", "created_at"]


class DatasetVersionSerializer(serializers.ModelSerializer):
    dataset = serializers.IntegerField(source="dataset_id")
    name = serializers.CharField(source="dataset.name")
    project = serializers.CharField(source="dataset.project.slug")
    files = serializers.SerializerMethodField()

    class Meta:
        model = DatasetVersion
        fields = [
            "id", "dataset", "project", "name", "version", "status", "progress", "errors", "format", "source_kind",
            "source_uri", "label_column", "text_column", "delimiter", "split", "requested_options", "num_records", "size_bytes",
            "content_hash", "schema", "channel_counts", "preview", "files", "created_at", "validated_at", "provenance",
        ]

    def get_files(self, version: DatasetVersion) -> list[dict]:
        return [
            {"path": f["path"], "size": f["size"], "channel": f.get("channel", ""), "records": f.get("records")}
            for f in version.files
        ]


class DatasetRegisteredSerializer(DatasetVersionSerializer):
    """The answer to a registration: the new version (201), or the latest one when the
    files and the options are identical to it (200, unchanged, with the reason)."""

    created = serializers.BooleanField(read_only=True)
    unchanged = serializers.BooleanField(read_only=True)
    reason = serializers.CharField(read_only=True, allow_null=True, help_text="Why nothing changed; null for a new version.")

    class Meta(DatasetVersionSerializer.Meta):
        fields = [*DatasetVersionSerializer.Meta.fields, "created", "unchanged", "reason"]


class DatasetSerializer(serializers.ModelSerializer):
    project = serializers.CharField(source="project.slug")
    latest_version = serializers.SerializerMethodField()
    versions = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = ["id", "project", "name", "description", "created_at", "latest_version", "versions"]

    def get_latest_version(self, dataset: Dataset) -> dict | None:
        versions = list(dataset.versions.all())  # prefetched, newest first
        return VersionSummarySerializer(versions[0]).data if versions else None

    def get_versions(self, dataset: Dataset) -> list[dict]:
        return VersionSummarySerializer(dataset.versions.all(), many=True).data
