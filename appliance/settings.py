"""Django settings for the Weir appliance, read from the environment (see appliance.env)."""
import os
from pathlib import Path

from appliance.env import (
    MAX_PRODUCE_BYTES,
    cache_prefix,
    celery_queues,
    database,
    env_bool,
    env_float,
    env_http_url,
    env_int,
    env_list,
    env_path,
    env_paths,
    front,
    private_dir,
    redis_prefix,
    redis_url,
    secret_key,
    token_max_in_flight,
    trusted_proxies,
    var_dir,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()

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
    "appliance.request_id.RequestIdMiddleware",  # first: every answer and log line has the id
    "appliance.proxy.TrustedProxyMiddleware",  # second: X-Forwarded-* only from the front
    "appliance.chunked.ChunkedBodyMiddleware",  # third: chunked bodies: read whole, length set
    "django.middleware.security.SecurityMiddleware",
    "appliance.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # the UI's and Swagger's assets, no CDN
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "appliance.urls"

# Content-Security-Policy of every answer (appliance/csp.py; Django 6's setting name and
# shape). The UI's script is its own files only (appliance/static/weir/): no inline script,
# no inline event handler, no eval; nothing may frame the UI, plug in or change its base.
# No page of the UI has inline style either. data: images are Swagger UI's icons.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}
# DRF's browsable API and the Swagger UI (third-party pages) use style attributes and
# <style> blocks: inline style (never script) is allowed under these paths.
WEIR_CSP_INLINE_STYLE_PATHS = ("/api/",)

# One line a record on stderr, with the request's id (appliance/request_id.py): gunicorn
# and Celery write it to $WEIR_VAR_DIR/log/<process>.log under scripts/run.sh. Every 5xx
# is logged by django.request (with its traceback when an exception caused it); 4xx
# answers are not logged (a client's bad requests must not fill the disk).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "appliance.request_id.RequestIdFilter"}},
    "formatters": {"weir": {
        "format": "%(asctime)s %(levelname)s %(name)s [request %(request_id)s] %(message)s",
    }},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "filters": ["request_id"],
                            "formatter": "weir"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
    "loggers": {
        # Django's own handlers (console only when DEBUG, mail to no ADMINS) dropped: its
        # records go to the root's handler like everyone's.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.request": {"level": "ERROR"},
    },
}
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
# Key files of encrypted channels, chosen by name (appliance/keys.py): created 0700 when
# missing; the appliance refuses to start when group or others may use it.
WEIR_KEY_DIR = private_dir("WEIR_KEY_DIR", env_path("WEIR_KEY_DIR", VAR_DIR / "keys"))
REDIS_URL = redis_url()
# What every key of this appliance in Redis starts with: appliance/env.py redis_prefix says
# what is under it and why.
WEIR_REDIS_PREFIX = redis_prefix(VAR_DIR)
# How often each process checks that the channels it has open still exist as it opened
# them (appliance/channels.py: a deleted or recreated channel is closed); 0: never.
WEIR_CHANNEL_WATCH_S = env_float("WEIR_CHANNEL_WATCH_S", 0.5, 0, 60)
# Largest produce request body; Django's own request body limit follows it.
WEIR_MAX_PRODUCE_BYTES = MAX_PRODUCE_BYTES  # and the front's client_max_body_size
DATA_UPLOAD_MAX_MEMORY_SIZE = WEIR_MAX_PRODUCE_BYTES

# The front (appliance/front.py): what scripts/run.sh puts in front of gunicorn ("nginx",
# or "none" for a deployment with a buffering front of its own), and the requests one API
# token may have in flight there (more: 429; 0: no limit). Keep the limit below the web
# threads (WEIR_WEB_WORKERS x WEIR_WEB_THREADS): one token then never holds every thread.
WEIR_FRONT = front()
WEIR_TOKEN_MAX_IN_FLIGHT = token_max_in_flight()
# Peers whose X-Forwarded-For/-Proto are believed (appliance/proxy.py): "unix" is the
# front on gunicorn's unix socket; add the address of a front that reaches gunicorn by TCP.
WEIR_TRUSTED_PROXIES = trusted_proxies()
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

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
    # A client's address is REMOTE_ADDR, which appliance/proxy.py took from the front;
    # never a client's own X-Forwarded-For.
    "NUM_PROXIES": 0,
    # every API error an RFC 9457 problem (application/problem+json)
    "EXCEPTION_HANDLER": "appliance.api.handler.exception_handler",
}

# Redis on the request path fails fast (appliance/shared_redis.py): a call times out
# after WEIR_REDIS_TIMEOUT_S, and after a failure Redis is not tried for WEIR_REDIS_RETRY_S;
# every such call has a fallback (throttling fails open).
WEIR_REDIS_TIMEOUT_S = env_float("WEIR_REDIS_TIMEOUT_S", 0.05, 0.005, 5)
WEIR_REDIS_RETRY_S = env_float("WEIR_REDIS_RETRY_S", 1.0, 0, 60)
# The shared cache: throttling counters, task locks, due keys.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": cache_prefix(WEIR_REDIS_PREFIX),  # WEIR_CACHE_PREFIX nested under it
        "TIMEOUT": 300,
        "OPTIONS": {"socket_timeout": WEIR_REDIS_TIMEOUT_S,
                    "socket_connect_timeout": WEIR_REDIS_TIMEOUT_S},
    }
}

# Celery (appliance/celery.py reads every CELERY_* setting). Redis is the broker; results
# (for "run now" actions that wait) live there too. Every task records its own runs.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 3600
# Three queues, each with its own worker (scripts/run.sh, docker-compose.yml): exports run
# for minutes, so on the shared queue two of them would hold every slot and the flusher
# would wait, breaking policy mode's loss bound; a Kafka sink run lasts up to a minute and
# must not wait behind an export either. appliance/celery.py routes them.
CELERY_TASK_DEFAULT_QUEUE, WEIR_EXPORT_QUEUE, WEIR_KAFKA_QUEUE = celery_queues()
CELERY_TASK_ROUTES = ("appliance.celery.route_task",)
CELERY_TASK_ACKS_LATE = True  # a task whose worker died mid-run is delivered again
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a slow checkpoint must not hold back queued flushes
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Unacked messages are redelivered after this: longer than the longest hard time limit
# (an export's 3660 s), so a running task's message is never handed to a second worker.
# A hung Redis stops a publish after socket_timeout, not never (a worker's BRPOP waits 1 s,
# well inside it); connecting gives up after CELERY_BROKER_CONNECTION_TIMEOUT, and a
# publish is retried for at most ~0.3 s. "Export now" asks Redis first, with a 0.25 s
# timeout, and answers 503 at once when it does not answer (appliance/exports.py).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 7200, "socket_timeout": 30,
                                   "socket_connect_timeout": 1,
                                   "global_keyprefix": f"{WEIR_REDIS_PREFIX}:"}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": f"{WEIR_REDIS_PREFIX}:"}
CELERY_BROKER_CONNECTION_TIMEOUT = 1
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0,
                                    "interval_step": 0.1, "interval_max": 0.2}
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
# The export worker's warm Spark driver (appliance/export_driver.py): on, a long-lived
# process runs its exports (seconds saved per run); off, each run is a process of its own.
# It exits after WEIR_EXPORT_DRIVER_IDLE_S without an export (its JVM's memory back).
WEIR_EXPORT_DRIVER = env_bool("WEIR_EXPORT_DRIVER", True)
WEIR_EXPORT_DRIVER_IDLE_S = env_float("WEIR_EXPORT_DRIVER_IDLE_S", 900.0, 5, 7 * 86400)
# ... and after WEIR_EXPORT_DRIVER_MAX_JOBS exports (the next starts a new one).
WEIR_EXPORT_DRIVER_MAX_JOBS = env_int("WEIR_EXPORT_DRIVER_MAX_JOBS", 1000, 1, 1_000_000)
# The appliance's base URL as the Spark executors see it. Empty (the default): executors
# read segment files from the shared disks. Set: they read ranges over the raw batches
# endpoint with a short-lived token (appliance/exports.py); its host must be in ALLOWED_HOSTS.
WEIR_EXPORT_READ_URL = env_http_url("WEIR_EXPORT_READ_URL")
# The Kafka sink (appliance/kafka_sinks.py): the brokers of a channel without kafka_bootstrap
# of its own (host:port[,host:port]; empty: such a channel cannot have a sink), and the
# compacted topic of its offsets records (channel_engine/kafka_sink/offsets_record.py).
WEIR_KAFKA_BOOTSTRAP = os.environ.get("WEIR_KAFKA_BOOTSTRAP", "").strip()
WEIR_KAFKA_OFFSETS_TOPIC = os.environ.get("WEIR_KAFKA_OFFSETS_TOPIC", "weir-sink-offsets")
CELERY_BEAT_SCHEDULE = {
    "flusher": {"task": "weir.flusher", "schedule": WEIR_SCHEDULER_TICK_S},
    "checkpointer": {"task": "weir.checkpointer", "schedule": WEIR_SCHEDULER_TICK_S},
    "retention": {"task": "weir.retention", "schedule": WEIR_SCHEDULER_TICK_S},
    "exporter": {"task": "weir.exporter", "schedule": WEIR_SCHEDULER_TICK_S},
    "kafka-sinker": {"task": "weir.kafka_sinker", "schedule": WEIR_SCHEDULER_TICK_S},
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
