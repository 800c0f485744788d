# cronlock's images, from one build:
# - the default target, the operator (entrypoint `cronlock-operator`; it also carries
#   `cronlock-sidecar` and the `cronlock` status CLI);
# - `--target sidecar`, what the operator injects into CronJobs (command
#   `cronlock-sidecar hold` / `gate`): the sidecar's package alone, which imports only
#   Python's standard library;
# - `--target sidecar-stores`, the sidecar with the Redis and PostgreSQL clients, which the
#   operator injects instead where a CronJob's lock is in such a store.
# Everything installed comes from hash-pinned lock files: the dependencies from
# requirements.lock, the build backend from requirements-build.lock, the store clients
# from requirements-stores.lock. No pip or setuptools is installed under /opt; the final
# stages keep the base image's own (docs/SECURITY.md, N12).
#
# The base is named by tag. To pin it by digest, build with
#   make image BASE=python:3.11-slim@sha256:<digest>
# (or --build-arg PYTHON=python:3.11-slim@sha256:<digest>), taking the digest from
# `docker buildx imagetools inspect python:3.11-slim` (or
# `skopeo inspect docker://python:3.11-slim`); bump it the same way (docs/INSTALL.md).
ARG PYTHON=python:3.11-slim

FROM ${PYTHON} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# The pip steps reach PyPI. Behind a proxy that intercepts TLS, give its CA bundle as the
# secret pip-ca (`--secret id=pip-ca,src=FILE`); it stays out of the image.
# Dependencies first: these layers stay cached until a lock file changes. The build
# backend goes into a venv of its own, which no image carries.
COPY requirements.lock requirements-build.lock ./
RUN --mount=type=secret,id=pip-ca \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && pip install --no-cache-dir --require-hashes -r requirements.lock \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes -r requirements-build.lock

COPY pyproject.toml README.md LICENSE ./
COPY operator/src operator/src
COPY sidecar/src sidecar/src
# The wheel is built with the pinned backend (no build isolation: nothing is fetched
# here) and installed without dependencies (all installed above). pip compiles the .pyc
# files, so nothing has to write them at run time. Then pip and setuptools leave the
# runtime venv.
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation \
        --wheel-dir /tmp/dist . \
    && pip install --no-cache-dir --no-deps --no-index /tmp/dist/cronlock-*.whl \
    && cronlock-operator --help >/dev/null \
    && cronlock-sidecar --help >/dev/null \
    && python -m pip uninstall --yes --quiet pip setuptools \
    && ! python -c "import pip" 2>/dev/null
# The sidecar's tree: its package as installed (mtimes kept, so its .pyc stay valid)
# and a launcher named like the console script. `-S`: the sidecar imports nothing from
# site-packages, and skipping `site` takes a few ms off each start (the sidecar's and the
# gate's are on every guarded run's way to its work, docs/PERFORMANCE.md).
RUN mkdir -p /opt/sidecar/bin \
    && cp -a /opt/venv/lib/python3.11/site-packages/cronlock_sidecar /opt/sidecar/ \
    && cp LICENSE /opt/sidecar/LICENSE \
    && printf '%s\n' '#!/usr/bin/env -S python3 -S' 'import sys' \
        'sys.path.insert(0, "/opt/sidecar")' \
        'from cronlock_sidecar.cli import main' 'sys.exit(main())' \
        >/opt/sidecar/bin/cronlock-sidecar \
    && chmod 0755 /opt/sidecar/bin/cronlock-sidecar \
    && PATH=/opt/sidecar/bin:/usr/local/bin:/usr/bin:/bin cronlock-sidecar --help >/dev/null


# The store clients for the sidecar-stores image (redis-py, psycopg with its bundled
# libpq), from their own hash-pinned lock, beside the sidecar's package: the sidecar
# imports them only when its lock is in Redis or PostgreSQL.
FROM builder AS stores-builder
COPY requirements-stores.lock ./
RUN --mount=type=secret,id=pip-ca \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes --no-deps \
        --target /opt/sidecar-stores -r requirements-stores.lock \
    && rm -rf /opt/sidecar-stores/bin \
    && PYTHONPATH=/opt/sidecar-stores python -c "import redis, psycopg; psycopg.pq.version()"


# Read-only root filesystem friendly, in every image: no .pyc writes, unbuffered logs,
# temp files in /tmp (an emptyDir in the chart). Numeric user, so the kubelet can verify
# runAsNonRoot without reading /etc/passwd.
FROM ${PYTHON} AS sidecar

LABEL org.opencontainers.image.title="cronlock-sidecar" \
      org.opencontainers.image.description="The sidecar cronlock injects into CronJobs: holds their Lease while a run works" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/cronlock/cronlock"

ENV PATH=/opt/sidecar/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp

COPY --from=builder /opt/sidecar /opt/sidecar

USER 65532:65532

ENTRYPOINT ["cronlock-sidecar"]


# `--target sidecar-stores`: the sidecar and one more layer, the Redis and PostgreSQL
# clients, for CronJobs whose lock is in such a store (cronlock.io/store, docs/STORES.md).
# The Lease's sidecar image stays without them.
FROM sidecar AS sidecar-stores

LABEL org.opencontainers.image.title="cronlock-sidecar-stores" \
      org.opencontainers.image.description="The cronlock sidecar with the Redis and PostgreSQL clients, for locks shared across clusters"

COPY --from=stores-builder /opt/sidecar-stores /opt/sidecar


FROM ${PYTHON}

LABEL org.opencontainers.image.title="cronlock" \
      org.opencontainers.image.description="Keep Kubernetes CronJob runs from overlapping with a Lease held by an injected sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/cronlock/cronlock"

# Two malloc arenas: the operator's worker threads would otherwise each grow their own
# and hold on to the memory of its start-up burst.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    MALLOC_ARENA_MAX=2

COPY --from=builder /opt/venv /opt/venv

USER 65532:65532

ENTRYPOINT ["cronlock-operator"]
