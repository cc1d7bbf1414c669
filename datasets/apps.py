from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "datasets"

    def ready(self) -> None:
        from datasets import checks  # noqa: F401  (registers the object store's system check)
        from datasets.storage import StorageError, store_for
        from studio.deletion import register_object_store

        register_object_store(store_for, StorageError)
