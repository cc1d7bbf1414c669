"""The upload page's form. The browser posts it to the API (POST /api/v1/datasets/) with
XMLHttpRequest so it can show upload progress; this form renders the fields with the same
names the API expects, and the API's serializer does the validation, so the two never
disagree about what is valid."""

from __future__ import annotations

from django import forms

from datasets.models import DatasetFormat
from studio.models import Project

SPLIT_PLACEHOLDER = '{"train": 0.8, "validation": 0.2, "seed": 42}'


class DatasetUploadForm(forms.Form):
    project = forms.ChoiceField(help_text="Projects where you are a scientist or an admin.")
    name = forms.CharField(max_length=200, help_text="Uploading to an existing name adds a new version.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}))
    description = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 3}))
    format = forms.ChoiceField(choices=[("", "Detect from the files"), *DatasetFormat.choices], required=False)
    label_column = forms.CharField(required=False, max_length=200,
                                   help_text="Leave empty to use a column named label, target, class, y or category.",
                                   widget=forms.TextInput(attrs={"spellcheck": "false"}))
    text_column = forms.CharField(required=False, max_length=200, help_text="For text classification: the column with the text.",
                                  widget=forms.TextInput(attrs={"spellcheck": "false"}))
    delimiter = forms.CharField(required=False, max_length=3, strip=False,
                                help_text="CSV only; detected when empty. Write \\t for tab.",
                                widget=forms.TextInput(attrs={"size": 4, "spellcheck": "false"}))
    split = forms.CharField(required=False, help_text="Split one set of files into channels by ratio.",
                            widget=forms.TextInput(attrs={"placeholder": SPLIT_PLACEHOLDER, "spellcheck": "false",
                                                          "class": "mono"}))
    source_uri = forms.CharField(required=False, max_length=1024, label="Source URI",
                                 help_text="s3://bucket/prefix/ or file:///path/under/an/allowed/root",
                                 widget=forms.TextInput(attrs={"placeholder": "s3://bucket/prefix/", "spellcheck": "false",
                                                               "class": "mono"}))

    def __init__(self, *args, projects: list[Project], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        project = self.fields["project"]
        assert isinstance(project, forms.ChoiceField)
        project.choices = [(p.slug, f"{p.name} ({p.slug})" if p.name != p.slug else p.slug) for p in projects]
