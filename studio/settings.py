"""Trainyard settings. Everything that differs between machines comes from the
environment; README.md lists every variable."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import dj_database_url

from studio.envconf import env_bool, env_int, env_paths, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("STUDIO_DATA_DIR", str(BASE_DIR / "var"))).expanduser().resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    configured = env_str("STUDIO_SECRET_KEY")
    if configured:
        return configured
    # A key generated once per data directory keeps sessions valid across restarts
    # without anyone having to invent one for a local studio.
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("STUDIO_DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("STUDIO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("STUDIO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "studio",
    "datasets",
    "jobs",
    "tuning",
    "hosting",
    "review",
    "evaluations",
    "overview",
    "trainyard_site",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "studio.middleware.RejectNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "studio.middleware.ApiErrorMiddleware",
]

ROOT_URLCONF = "trainyard_site.urls"
WSGI_APPLICATION = "studio.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "studio.context.navigation",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
# Several processes write SQLite at once (web, control worker, nodes): WAL lets readers
# go on while one writes, and IMMEDIATE transactions take the write lock up front instead
# of failing with "database is locked" when a read transaction tries to upgrade.
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "studio.sqlite3"),
            "OPTIONS": SQLITE_OPTIONS,
            # Worker subprocesses in tests must see the test database, so it is a file; one
            # per test run, so two runs on one machine never share it.
            "TEST": {"NAME": str(Path(tempfile.gettempdir()) / f"trainyard-test-{os.getpid()}.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis, celery --------------------------------------------------------------------
# `studio up` and `make test` start an embedded Redis and export REDIS_URL when it is unset.
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# Tasks are acknowledged after they run so a worker killed mid-task does not lose it.
# The visibility timeout is longer than any control task; training jobs are owned through
# leases in the database, not through the broker (docs/SPEC.md §3.6), so a run that
# outlasts the visibility timeout is never started twice.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("STUDIO_BROKER_VISIBILITY_SECONDS", 6 * 3600)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "mark-lost-nodes": {"task": "jobs.tasks.mark_lost_nodes_task", "schedule": 2.0},
    "schedule-jobs": {"task": "jobs.tasks.schedule_jobs_task", "schedule": 2.0},
    "advance-tuning-jobs": {"task": "tuning.tasks.advance_tuning_jobs_task", "schedule": 2.0},
    "requeue-stalled-validations": {"task": "datasets.tasks.requeue_stalled_validations_task", "schedule": 60.0},
    # Expired claim leases back to the queue, loops past their availability to Expired,
    # completed loops whose output JSON is not written yet written (review.tasks).
    "expire-review-work": {"task": "review.tasks.expire_review_work_task", "schedule": 2.0},
    # Batch predictions whose worker died mid-run are handed to another (hosting.tasks).
    "requeue-stalled-batch-predictions": {"task": "hosting.tasks.requeue_stalled_batch_predictions_task", "schedule": 30.0},
    # Evaluations whose worker died mid-run, or whose message was lost (evaluations.tasks).
    "requeue-stalled-evaluations": {"task": "evaluations.tasks.requeue_stalled_evaluations_task", "schedule": 30.0},
    # Store objects of deleted rows whose background removal was interrupted (studio.deletion).
    "sweep-pending-deletions": {"task": "studio.tasks.sweep_pending_deletions_task", "schedule": 60.0},
    # Notifications whose next try is due (studio.notify: retried with back-off).
    "retry-deliveries": {"task": "studio.tasks.retry_deliveries_task", "schedule": 5.0},
    # The cluster's state for the Nodes page's charts over time (jobs.cluster).
    "sample-cluster": {"task": "jobs.tasks.sample_cluster_task", "schedule": float(env_int("STUDIO_CLUSTER_SAMPLE_SECONDS", 15))},
}

# --- storage --------------------------------------------------------------------------
STUDIO_OBJECT_STORE = env_str("STUDIO_OBJECT_STORE", (DATA_DIR / "objects").as_uri())
AWS_ENDPOINT_URL = env_str("AWS_ENDPOINT_URL") or None
STUDIO_DATA_ROOTS = [p.resolve() for p in env_paths("STUDIO_DATA_ROOTS", [DATA_DIR / "data"])]
STUDIO_MAX_UPLOAD_BYTES = env_int("STUDIO_MAX_UPLOAD_BYTES", 2 * 1024**3)
STUDIO_NODE_LOST_SECONDS = env_int("STUDIO_NODE_LOST_SECONDS", 30)
STUDIO_NODE_HEARTBEAT_SECONDS = env_int("STUDIO_NODE_HEARTBEAT_SECONDS", 5)
DATA_UPLOAD_MAX_NUMBER_FILES = env_int("STUDIO_MAX_UPLOAD_FILES", 10_000)

# --- rules, notifications, cost, /metrics (docs/SPEC.md §10) ---------------------------
# How often the rule watcher evaluates the time-based rules (stalled, max_init_time, budget).
STUDIO_RULES_TICK_SECONDS = float(env_int("STUDIO_RULES_TICK_SECONDS", 1))
# Webhook deliveries: tries in all, the first retry's delay (doubling), and each POST's timeout.
STUDIO_WEBHOOK_ATTEMPTS = env_int("STUDIO_WEBHOOK_ATTEMPTS", 5)
STUDIO_WEBHOOK_BACKOFF_SECONDS = float(env_int("STUDIO_WEBHOOK_BACKOFF_SECONDS", 2))
STUDIO_WEBHOOK_TIMEOUT_SECONDS = float(env_int("STUDIO_WEBHOOK_TIMEOUT_SECONDS", 10))
# Networks no webhook is sent to, whatever a project admin enters (studio.notify): by default
# link-local ones, where clouds serve instance metadata and credentials (169.254.169.254,
# fd00:ec2::254). Add private ranges to keep webhooks off the studio's own network.
STUDIO_WEBHOOK_DENIED_NETWORKS = [n.strip() for n in env_str(
    "STUDIO_WEBHOOK_DENIED_NETWORKS", "169.254.0.0/16,fe80::/10,fd00:ec2::254/128").split(",") if n.strip()]
EMAIL_BACKEND = env_str("STUDIO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("STUDIO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("STUDIO_EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env_str("STUDIO_EMAIL_FROM", "trainyard@localhost")
# The studio's address as its users reach it (https://studio.example.com): notifications link
# to the job with it. Empty: they carry no link (a worker cannot know the address itself).
STUDIO_PUBLIC_URL = env_str("STUDIO_PUBLIC_URL", "").rstrip("/")
# Site-wide prices per instance type, JSON: {"cpu": 0.12, "gpu": {"node": 1.0, "gpu": 2.5}}
# (per node-hour; "gpu" per GPU-hour on top). A project admin's price wins over these.
STUDIO_INSTANCE_PRICES = env_str("STUDIO_INSTANCE_PRICES", "{}")
STUDIO_CURRENCY = env_str("STUDIO_CURRENCY", "USD")
# /metrics (Prometheus): a scraper sends `Authorization: Bearer <STUDIO_METRICS_TOKEN>`, or
# comes from one of these networks (comma-separated CIDRs; loopback by default).
STUDIO_METRICS_TOKEN = env_str("STUDIO_METRICS_TOKEN")
STUDIO_METRICS_ALLOWED_NETWORKS = [n.strip() for n in env_str("STUDIO_METRICS_ALLOWED_NETWORKS", "127.0.0.1/32,::1/128").split(",")
                                   if n.strip()]
STUDIO_CLUSTER_SAMPLE_DAYS = env_int("STUDIO_CLUSTER_SAMPLE_DAYS", 7)

# --- auth -----------------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"
SESSION_COOKIE_HTTPONLY = True
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
]
# The test suite only (tests/conftest.py sets it, and the studios and workers it starts inherit
# it): a PBKDF2 hash costs 0.4 s here and the suite makes well over a thousand users, so there
# MD5 comes first. Never set it for a studio people sign in to.
if env_bool("STUDIO_TEST_FAST_PASSWORD_HASHING", False):
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", "django.contrib.auth.hashers.PBKDF2PasswordHasher"]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "studio.authentication.BearerTokenAuthentication",
        "studio.authentication.CsrfSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["studio.parsers.JSONParser", "studio.parsers.FormParser", "studio.parsers.MultiPartParser"],
    "DEFAULT_PAGINATION_CLASS": "studio.api.PagePagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "studio.api.error_envelope_handler",
    "DEFAULT_SCHEMA_CLASS": "studio.schema.StudioAutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
from studio.version import VERSION  # noqa: E402 - beside the setting that uses it

SPECTACULAR_SETTINGS = {
    "TITLE": "Trainyard API",
    "DESCRIPTION": "Datasets, training jobs, tuning, models and human review. "
    "Authenticate with `Authorization: Bearer <token>` (POST /api/v1/tokens/ to get one).",
    "VERSION": VERSION,
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "studio.schema.openapi_30_nullable"],
    # One group per resource on the docs page (StudioAutoSchema tags each operation with its
    # first path part); listed here in reading order, with a line each. New resources
    # appear after these without being listed.
    "TAGS": [
        {"name": "projects", "description": "Projects and their members (roles: admin, scientist, viewer, reviewer)."},
        {"name": "datasets", "description": "Register data (upload, s3://, server path); each registration is a version."},
        {"name": "dataset-versions", "description": "Versions: status, files, downloads, retrain from an export."},
        {"name": "algorithms", "description": "The built-in algorithms and their hyperparameters."},
        {"name": "scripts", "description": "Upload a training script (a .py or an archive)."},
        {"name": "jobs", "description": "Training jobs: submit, read, stop, delete; metrics, logs, live events."},
        {"name": "tuning-jobs", "description": "Hyperparameter tuning: many jobs searching a range."},
        {"name": "models", "description": "Registered models and their versions."},
        {"name": "endpoints", "description": "Serve a model version; invocations."},
        {"name": "batch-predictions", "description": "Predict over a dataset version."},
        {"name": "work-teams", "description": "Reviewer teams."},
        {"name": "flow-definitions", "description": "Human review flows: activation, export, statistics."},
        {"name": "human-loops", "description": "Items sent for human review."},
        {"name": "review", "description": "The reviewer's API: claim, answer, release."},
        {"name": "nodes", "description": "The compute nodes and their instance types."},
        {"name": "tokens", "description": "Your API tokens."},
        {"name": "health", "description": "Database, Redis and nodes."},
    ],
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "jobs.models.JobStatus",
        "VersionStatusEnum": "datasets.models.VersionStatus",
        "NodeStateEnum": "jobs.models.NodeState",
        "TuningStatusEnum": "tuning.models.TuningStatus",
        "RuleStateEnum": "jobs.models.RuleState",
        "TypeEnum": "jobs.serializers_responses.HYPERPARAMETER_TYPE_CHOICES",
        "SourceEnum": "jobs.api_cost.PRICE_SOURCES",
        "LogSourceEnum": "jobs.serializers_responses.LOG_SOURCE_CHOICES",
    },
}

# --- i18n, static ---------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
# Collected (hashed, compressed) static files; several studios on one machine may share them.
STATIC_ROOT = Path(env_str("STUDIO_STATIC_ROOT", str(DATA_DIR / "staticfiles"))).expanduser().resolve()
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
# plotly's own bundled plotly.min.js, served as /static/vendor/plotly/plotly.min.js (no CDN).
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "studio.staticfiles.PlotlyFinder",
]
# Hashed names, gzip and brotli copies (studio/staticfiles.py): whitenoise sends a hashed
# file with a ten-year immutable cache and the encoding the browser accepts. The manifest
# comes from `collectstatic`, which `studio up` and the test session run (a second run takes
# seconds); with STUDIO_DEBUG the files come unhashed from the finders instead.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "studio.staticfiles.StudioStaticStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("STUDIO_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # One line per periodic task every few seconds drowns what matters in `make run`.
        "celery.app.trace": {"level": env_str("STUDIO_TASK_LOG_LEVEL", "WARNING")},
        "celery.worker.strategy": {"level": env_str("STUDIO_TASK_LOG_LEVEL", "WARNING")},
        "celery.beat": {"level": env_str("STUDIO_TASK_LOG_LEVEL", "WARNING")},
    },
}

# Queue names, overridable so a test session never shares queues with a running studio.
STUDIO_CONTROL_QUEUE = env_str("STUDIO_CONTROL_QUEUE", "control")
CELERY_TASK_DEFAULT_QUEUE = STUDIO_CONTROL_QUEUE
CELERY_TASK_ROUTES = {"datasets.tasks.*": {"queue": STUDIO_CONTROL_QUEUE}, "jobs.tasks.mark_lost_nodes_task": {"queue": STUDIO_CONTROL_QUEUE}}
