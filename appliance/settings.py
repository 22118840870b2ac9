"""Django settings for the Weir appliance, read from the environment (see appliance.env)."""
import os
from pathlib import Path

from appliance.env import (
    celery_queues,
    database,
    env_bool,
    env_float,
    env_http_url,
    env_list,
    env_path,
    env_paths,
    secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = env_path("WEIR_VAR_DIR", BASE_DIR / "var")

SECRET_KEY = secret_key(VAR_DIR)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "appliance",
]

MIDDLEWARE = [
    "appliance.chunked.ChunkedBodyMiddleware",  # chunked bodies: read whole, length set
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # the UI's and Swagger's assets, no CDN
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "appliance.urls"
WSGI_APPLICATION = "appliance.wsgi.application"

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
            ],
        },
    },
]

DATABASES = {"default": database(VAR_DIR)}

# Where channel data and checkpoint dirs may live (comma-separated absolute paths).
WEIR_DATA_ROOTS = env_paths("WEIR_DATA_ROOT", [VAR_DIR / "channels"])
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# Largest produce request body; Django's own request body limit follows it.
WEIR_MAX_PRODUCE_BYTES = 64 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = WEIR_MAX_PRODUCE_BYTES

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# WhiteNoise serves the apps' static files straight from where they are (no STATIC_ROOT,
# no collectstatic step to forget); gunicorn serves them with the rest.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# The admin UI (appliance/ui): staff users log in with Django's auth.
LOGIN_URL = "ui:login"
LOGIN_REDIRECT_URL = "ui:dashboard"
LOGOUT_REDIRECT_URL = "ui:login"
# How often the UI's status parts refresh themselves.
WEIR_UI_REFRESH_S = env_float("WEIR_UI_REFRESH_S", 3.0, low=0.5, high=300)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "appliance.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["appliance.throttling.TokenRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"token": os.environ.get("WEIR_API_RATE", "100000/minute")},
}

# The shared cache: throttling history (and later, anything web workers must agree on).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("WEIR_CACHE_PREFIX", "weir"),
        "TIMEOUT": 300,
    }
}

# Celery (appliance/celery.py reads every CELERY_* setting). Redis is the broker; results
# (for "run now" actions that wait) live there too. Every task records its own runs.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 3600
# Two queues, each with its own worker (scripts/run.sh, docker-compose.yml): exports run
# for minutes, so on the shared queue two of them would hold every slot and the flusher
# would wait, breaking policy mode's loss bound. appliance/celery.py routes them.
CELERY_TASK_DEFAULT_QUEUE, WEIR_EXPORT_QUEUE = celery_queues()
CELERY_TASK_ROUTES = ("appliance.celery.route_task",)
CELERY_TASK_ACKS_LATE = True  # a task whose worker died mid-run is delivered again
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a slow checkpoint must not hold back queued flushes
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Unacked messages are redelivered after this: longer than the longest hard time limit
# (an export's 3660 s), so a running task's message is never handed to a second worker.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 7200}
CELERY_TIMEZONE = "UTC"
# How often beat wakes the dispatchers; each channel's own intervals decide what runs.
WEIR_SCHEDULER_TICK_S = env_float("WEIR_SCHEDULER_TICK_S", 1.0, 0.1, 60)
WEIR_SAMPLE_INTERVAL_S = env_float("WEIR_SAMPLE_INTERVAL_S", 10.0, 1, 3600)
WEIR_TASK_RUNS_KEEP_HOURS = env_float("WEIR_TASK_RUNS_KEEP_HOURS", 24.0, 0.1, 24 * 365)
WEIR_TASK_LOCK_WAIT_S = env_float("WEIR_TASK_LOCK_WAIT_S", 30.0, 0, 3600)
# A run's single-flight lock lasts its hard time limit plus this: a worker killed mid-run
# leaves a lock that lapses then (appliance/task_runs.py).
WEIR_TASK_LOCK_GRACE_S = 30.0
# Where exports go (hdfs://namenode:8020/weir in production), and the Spark master.
WEIR_EXPORT_URI = os.environ.get("WEIR_EXPORT_URI") or (VAR_DIR / "export").as_uri()
WEIR_SPARK_MASTER = os.environ.get("WEIR_SPARK_MASTER", "local[*]")
# The appliance's base URL as the Spark executors see it. Empty (the default): executors
# read segment files from the shared disks. Set: they read ranges over the raw batches
# endpoint with a short-lived token (appliance/exports.py); its host must be in ALLOWED_HOSTS.
WEIR_EXPORT_READ_URL = env_http_url("WEIR_EXPORT_READ_URL")
CELERY_BEAT_SCHEDULE = {
    "flusher": {"task": "weir.flusher", "schedule": WEIR_SCHEDULER_TICK_S},
    "checkpointer": {"task": "weir.checkpointer", "schedule": WEIR_SCHEDULER_TICK_S},
    "retention": {"task": "weir.retention", "schedule": WEIR_SCHEDULER_TICK_S},
    "exporter": {"task": "weir.exporter", "schedule": WEIR_SCHEDULER_TICK_S},
    "metrics-sampler": {"task": "weir.sample_metrics", "schedule": WEIR_SAMPLE_INTERVAL_S},
    "prune-runs": {"task": "weir.prune_history", "schedule": 600.0},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Weir API",
    "DESCRIPTION": "Produce to, consume from and inspect Weir channels.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",  # served by the appliance: no CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
