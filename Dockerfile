# The muster image: the `muster` CLI, which runs the migration (`db upgrade`) and every service
# (`run admission|queue|placement|reconciler|projector|cluster`). See docker-compose.yml and
# deploy/k8s. Dependencies come from requirements.lock: every version pinned and every file's hash
# checked (`make lock` writes it from pyproject.toml with pip-compile, for CPython 3.11 on Linux
# x86-64, the platform of this base image).
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    MUSTER_METRICS_PORT=9464

WORKDIR /app

COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock

# The source runs from /app (PYTHONPATH): `muster db upgrade` finds the Alembic migrations next to
# it (shared/history/schema.py: <package root>/../migrations). Nothing is installed from the source,
# so nothing unpinned is fetched.
COPY pyproject.toml README.md alembic.ini ./
COPY shared/ shared/
COPY services/ services/
COPY migrations/ migrations/

# Unprivileged at runtime, the code root-owned and read-only to it (Faust's data folders go under
# /tmp, an emptyDir in deploy/k8s where the root filesystem is read-only).
RUN useradd --create-home --uid 10001 muster
USER 10001

# `muster run SERVICE` serves /metrics, /healthz and /readyz here (--metrics-port, MUSTER_METRICS_PORT);
# the HEALTHCHECK asks /healthz, which answers while the service's event loop does.
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('MUSTER_METRICS_PORT', '9464'), timeout=4)"]

ENTRYPOINT ["python", "-m", "shared.cli.main"]
CMD ["--help"]
