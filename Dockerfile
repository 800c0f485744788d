# cronlock: one image for the operator (entrypoint `cronlock-operator`) and the sidecar it
# injects into CronJobs (command `cronlock-sidecar hold` / `gate`, which overrides the
# entrypoint). Dependencies come only from the hash-pinned requirements.lock.

FROM python:3.11-slim AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# Both pip steps reach PyPI (the second for the build backend). Behind a proxy that
# intercepts TLS, give its CA bundle as the secret pip-ca (`--secret id=pip-ca,src=FILE`);
# it stays out of the image.
# Dependencies first: this layer stays cached until the lock file changes.
COPY requirements.lock ./
RUN --mount=type=secret,id=pip-ca \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && pip install --no-cache-dir --require-hashes -r requirements.lock

COPY pyproject.toml README.md ./
COPY operator/src operator/src
COPY sidecar/src sidecar/src
# --no-deps: everything the project needs is already installed from the lock file.
# pip compiles the .pyc files here, so nothing has to write them at run time.
RUN --mount=type=secret,id=pip-ca \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && pip install --no-cache-dir --no-deps . \
    && cronlock-operator --help >/dev/null \
    && cronlock-sidecar --help >/dev/null


FROM python:3.11-slim

LABEL org.opencontainers.image.title="cronlock" \
      org.opencontainers.image.description="Keep Kubernetes CronJob runs from overlapping with a Lease held by an injected sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/cronlock/cronlock"

# Read-only root filesystem friendly: no .pyc writes, unbuffered logs, temp files in /tmp
# (an emptyDir in the chart). Two malloc arenas: the operator's worker threads would
# otherwise each grow their own and hold on to the memory of its start-up burst.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    MALLOC_ARENA_MAX=2

COPY --from=builder /opt/venv /opt/venv

# Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532

ENTRYPOINT ["cronlock-operator"]
