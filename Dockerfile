# gpuguard: one image for `gpuguard serve` (admission webhook), `gpuguard audit` (CronJob) and
# `gpuguard inventory` (DaemonSet); the manifests are in deploy/.
#
#   docker build -t REGISTRY/gpuguard:0.1.0 .      (docs/install.md)
#
# Stage 1 installs the locked dependencies (requirements/runtime.txt: exact versions and their
# sha256 hashes, all manylinux wheels: no compiler needed; regenerate with `bash .ci/lock`) into a
# virtual environment, then builds the wheel from this repository with the locked build backend
# and installs it over them with --no-deps: nothing unpinned is resolved. Stage 2 copies only that
# environment onto a clean slim image: no pip, setuptools, build tools or sources.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The lock first: its layer (the slow one) is reused until the lock changes.
COPY requirements/runtime.txt requirements/runtime.txt
RUN python -m venv /opt/gpuguard \
 && /opt/gpuguard/bin/pip install --require-hashes --only-binary=:all: \
      -r requirements/runtime.txt
# Only what the wheel is built from (pyproject.toml names README.md as the long description;
# gpuguard/examples links to examples/, the package data of the bundled snapshot).
COPY pyproject.toml README.md ./
COPY examples/ examples/
COPY policies/ policies/
COPY webhook/ webhook/
COPY audit/ audit/
COPY kube/ kube/
COPY certs/ certs/
COPY gpuguard/ gpuguard/
RUN /opt/gpuguard/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/gpuguard/bin/pip install --no-deps /wheels/gpuguard-*.whl \
 && /opt/gpuguard/bin/pip check \
 && /opt/gpuguard/bin/gpuguard --version \
 && /opt/gpuguard/bin/pip uninstall --yes setuptools wheel pip \
 && /opt/gpuguard/bin/python -m compileall -q /opt/gpuguard

FROM ${PYTHON_IMAGE}
# The read-only root filesystem of the manifests: no .pyc writes at run time (compiled above).
ENV PATH=/opt/gpuguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/gpuguard /opt/gpuguard
# A fixed numeric non-root user, the one the manifests' securityContext names (runAsUser 65532),
# so runAsNonRoot can be verified by the kubelet.
RUN groupadd --system --gid 65532 gpuguard \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpuguard
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpuguard"]
CMD ["--help"]
