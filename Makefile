# The two commands a newcomer needs: `make demo` and `make test`. Both set up
# everything themselves: the Debian packages the node needs (runc, CNI plugins,
# buildah, mmdebstrap), the virtualenv, the Python packages, the local Kubernetes
# control plane and real node (built once, cached under ~/.cache/cronlock) and the
# images built from our Dockerfile.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-steps node-builds checks test-compat lint typecheck unit integration e2e clusters benchmarks controlplane builds images image release krew up down lock chart-readme clean

$(STAMP): requirements-dev.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements-dev.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

controlplane:
	@tests/controlplane/host-packages
	@tests/controlplane/build >/dev/null

# Everything the test rings run that is built (the control plane and node binaries, the
# node's images, the Go test tools), built before pytest starts so no test's timeout
# covers a build; two jobs at once (tests/controlplane/prebuild). The tests find the
# images through CRONLOCK_IMAGES_DIR and the tools in the cache (one test run alone still
# builds what is missing).
CACHE_DIR := $(or $(CRONLOCK_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cronlock)
IMAGES_DIR := $(CACHE_DIR)/images/out
# $(call prebuild,MODE): runs `prebuild MODE` and checks it built the images where the
# tests will look for them.
prebuild = @built=$$(tests/controlplane/prebuild $(1)) || exit; [[ $$built == "$(IMAGES_DIR)" ]] || \
	  { echo "$@: the images are in '$$built', not $(IMAGES_DIR)" >&2; exit 1; }
builds:
	$(call prebuild,)

demo: $(STAMP) controlplane
	@$(PY) -m tests.e2e.demo $(DEMO_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$$(tests/controlplane/gotool actionlint) -no-color

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest tests/unit

integration: $(STAMP) builds
	CRONLOCK_IMAGES_DIR=$(IMAGES_DIR) $(VENV)/bin/pytest tests/integration tests/longwatch

e2e: $(STAMP) builds
	CRONLOCK_IMAGES_DIR=$(IMAGES_DIR) $(VENV)/bin/pytest tests/e2e

# Two real clusters (each its control plane and node) on one store lock (docs/E2E.md).
clusters: $(STAMP) builds
	CRONLOCK_IMAGES_DIR=$(IMAGES_DIR) $(VENV)/bin/pytest tests/clusters

# Everything CI runs: lint, types, and all the rings of tests, once everything is built;
# the rings run side by side, each pytest process with its own control plane
# (tests/rings.py: unit+integration, integration-b, tools, longwatch and clusters beside the
# two e2e rings, on nodes 1 and 5; logs in .testenv/rings/).
# Ends with its own time in all, set-up included.
test:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory test-steps; status=$$?; took=$$(( $$(date +%s) - start )); \
	echo "make test: exit $$status in $$((took / 60)) min $$((took % 60)) s in all" \
	  "(virtualenv, builds, lint, types, rings)"; exit $$status

# What the e2e ring needs is built first (prebuild --node), and the e2e ring, the longest,
# starts at once; the tools ring builds the other Go test tools and runs actionlint before
# its pytest (tests/rings.py BEFORE), while the other rings run. The
# virtualenv, the lint and the types need none of the node's builds: on a fresh machine
# they run beside them (make -j2), off the critical path (docs/DEVELOPMENT.md).
test-steps:
	@$(MAKE) --no-print-directory -j2 node-builds checks
	CRONLOCK_IMAGES_DIR=$(IMAGES_DIR) $(PY) -m tests.rings --durations=25

node-builds:
	$(call prebuild,--node)

checks: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

# The compatibility ring (tests/compat.py): a slice of the e2e ring on every Kubernetes
# release the chart admits, or on KUBERNETES=v1.30.14 alone; each release's control plane
# and node built once and cached. COMPAT_ARGS=--write puts the table in
# docs/COMPATIBILITY.md.
test-compat: $(STAMP) builds
	CRONLOCK_IMAGES_DIR=$(IMAGES_DIR) $(PY) -m tests.compat $(COMPAT_ARGS) $(KUBERNETES)

benchmarks: $(STAMP) controlplane
	$(PY) -m tests.benchmarks $(BENCH_ARGS)

# The control plane alone (tests/controlplane/up), or with the real node:
#   eval "$$(make -s up)"; eval "$$(tests/controlplane/node up)"
up: controlplane
	@tests/controlplane/up

down:
	@tests/controlplane/node down
	@tests/controlplane/down

# The images the real node runs, built from the Dockerfile by buildah (no Docker needed).
images: controlplane
	@tests/controlplane/images

# The images from the Dockerfile: the operator (default target), the sidecar it injects
# (target `sidecar`) and the sidecar with the Redis and PostgreSQL clients (target
# `sidecar-stores`, for cronlock.io/store). With docker when there is one, else buildah (daemonless;
# `apt-get install buildah`). Push all three where your cluster pulls from (the operator's
# pod runs both sidecar images as init containers) and install the chart with
# image.repository, sidecarImage.repository and sidecarStoresImage.repository set
# (docs/INSTALL.md, "Build the images"):
#   make image IMAGE=registry.example.com/cronlock:0.1.0 \
#     SIDECAR_IMAGE=registry.example.com/cronlock-sidecar:0.1.0 \
#     SIDECAR_STORES_IMAGE=registry.example.com/cronlock-sidecar-stores:0.1.0
# tests/controlplane/images builds the e2e ring's images through this target too.
IMAGE ?= cronlock:dev
SIDECAR_IMAGE ?= cronlock-sidecar:dev
SIDECAR_STORES_IMAGE ?= cronlock-sidecar-stores:dev
BUILDER ?= $(if $(shell command -v docker 2>/dev/null),docker,buildah)
BUILDAH ?= buildah
BUILD_FLAGS ?=
# The base image, pinned by digest, e.g. BASE=python:3.11-slim@sha256:<digest> (empty: the
# Dockerfile's python:3.11-slim, by tag). docs/INSTALL.md says how to look it up and bump it.
BASE ?=
image_flags = $(BUILD_FLAGS) $(if $(BASE),--build-arg PYTHON=$(BASE))
image:
ifeq ($(BUILDER),docker)
	docker build $(image_flags) --tag $(IMAGE) .
	docker build $(image_flags) --target sidecar --tag $(SIDECAR_IMAGE) .
	docker build $(image_flags) --target sidecar-stores --tag $(SIDECAR_STORES_IMAGE) .
else
	$(BUILDAH) bud $(image_flags) --tag $(IMAGE) .
	$(BUILDAH) bud $(image_flags) --target sidecar --tag $(SIDECAR_IMAGE) .
	$(BUILDAH) bud $(image_flags) --target sidecar-stores --tag $(SIDECAR_STORES_IMAGE) .
endif

# Regenerate charts/cronlock/README.md from values.yaml's `# --` comments (helm-docs, built
# once from its pinned Go module); tests/unit/test_chart_readme.py fails when it is stale.
chart-readme:
	charts/readme

# A release: the images for amd64 and arm64 as image indexes, pushed, the chart as an
# OCI artifact that names them by digest, and the krew plugin in dist/ (hack/krew;
# `make krew` builds it alone) (hack/release says what goes where):
#   make release REGISTRY=ghcr.io/cronlock [VERSION=x.y.z] [PLATFORMS=linux/amd64,linux/arm64]
# arm64 builds under emulation (on Debian, as root: tests/controlplane/emulation arm64;
# the release workflow: setup-qemu-action). `make test` releases the host's platform alone.
PLATFORMS ?= linux/amd64,linux/arm64
release:
	PLATFORMS=$(PLATFORMS) hack/release

# The krew plugin alone, into dist/: from the hash-checked wheels in the cache, which
# prebuild --tools fetches too (hack/krew --fetch-only); fetched here if missing.
krew: $(STAMP)
	$(PY) hack/krew --wheels $(CACHE_DIR)/krew/wheels

# Regenerate the hash-pinned lock files after changing dependencies in pyproject.toml.
lock:
	uv pip compile pyproject.toml --extra operator --python-version 3.11 --generate-hashes -o requirements.lock
	uv pip compile pyproject.toml --extra dev --python-version 3.11 --generate-hashes -o requirements-dev.lock
	uv pip compile requirements-stores.in --python-version 3.11 --generate-hashes -c requirements-dev.lock -o requirements-stores.lock
	uv pip compile requirements-build.in --python-version 3.11 --generate-hashes -o requirements-build.lock

clean:
	rm -rf $(VENV) .testenv .pytest_cache .mypy_cache .ruff_cache
