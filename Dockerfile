# The Weir appliance image: migrate, web (gunicorn), Celery worker and beat all run it
# (see docker-compose.yml). Not built on the development machines: no Docker engine there.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

# Java for PySpark (the exporter, coming soon). Some JRE postinst scripts fail on slim
# images without the man directory, hence the mkdir. Debian's nginx: the front
# (appliance/front.py; docker-compose.yml's nginx service runs this image).
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless nginx \
    && rm -rf /var/lib/apt/lists/*

# The code stays in /app (root-owned, read-only to the appliance): settings find
# templates/ next to it, and PYTHONPATH makes every process import this copy.
# Packages from the hash-checked runtime lock (scripts/lock.sh), then the project itself
# without dependencies, built by the locked setuptools: the image gets exactly the lock.
WORKDIR /app
COPY requirements/runtime.txt requirements/runtime.txt
RUN pip install --require-hashes --no-deps -r requirements/runtime.txt
COPY . .
RUN pip install --no-deps --no-build-isolation .

# A fixed uid: web and worker containers share channel files and the owner's Unix socket,
# which accepts only peers of its own uid. The var dir and data roots are created here,
# owned by that user, so fresh named volumes mounted on them start out writable.
RUN groupadd --system --gid 10001 weir \
    && useradd --system --uid 10001 --gid weir --home-dir /var/lib/weir --no-create-home \
       --shell /usr/sbin/nologin weir \
    && mkdir -p /var/lib/weir /data/weir-a /data/weir-b /run/weir \
    && chown weir:weir /var/lib/weir /data/weir-a /data/weir-b /run/weir
USER weir

# The image's default serves gunicorn directly (no front); docker-compose.yml instead runs
# web on a unix socket behind its nginx service.
EXPOSE 8000
CMD ["gunicorn", "appliance.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--threads", "2", \
     "--access-logfile", "-", "--error-logfile", "-"]
