from django.apps import AppConfig


class StudioConfig(AppConfig):
    name = "studio"
    verbose_name = "Studio"

    def ready(self) -> None:
        from studio import checks, schema  # noqa: F401  (registers system checks and OpenAPI extensions)
