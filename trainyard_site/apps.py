from django.apps import AppConfig


class TrainyardSiteConfig(AppConfig):
    name = "trainyard_site"
    verbose_name = "Trainyard site"
