# The muster image: the `muster` CLI, which runs the migration (`db upgrade`) and every service
# (`run admission|queue|placement|reconciler|projector`). See docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

COPY pyproject.toml README.md alembic.ini ./
COPY shared/ shared/
COPY services/ services/
COPY migrations/ migrations/

# Editable on purpose: `muster db upgrade` finds the Alembic migrations next to the source tree
# (shared/store/schema.py: <package root>/../migrations), i.e. /app/migrations. A plain
# `pip install .` would put shared/ in site-packages, where no migrations/ sits beside it.
RUN pip install --no-cache-dir -e .

# Unprivileged at runtime; the code stays root-owned (Faust's data folders go under /tmp).
RUN useradd --create-home --uid 10001 muster
USER muster

# `muster run SERVICE` serves /metrics, /healthz and /readyz here (--metrics-port, MUSTER_METRICS_PORT).
EXPOSE 9464

ENTRYPOINT ["muster"]
CMD ["--help"]
