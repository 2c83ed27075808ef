# gpuguard: one image for `gpuguard serve` (admission webhook), `gpuguard audit` (CronJob) and
# `gpuguard inventory` (DaemonSet); the manifests are in deploy/.
#
#   docker build -t REGISTRY/gpuguard:0.1.0 .
#
# Stage 1 builds the wheel from this repository and installs it, with its dependencies (all of
# them ship manylinux wheels: no compiler needed), into a virtual environment. Stage 2 copies only
# that environment onto a clean slim image: no pip, setuptools, build tools or sources.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (pyproject.toml names README.md as the long description).
COPY pyproject.toml README.md ./
COPY policies/ policies/
COPY webhook/ webhook/
COPY audit/ audit/
COPY kube/ kube/
COPY certs/ certs/
COPY gpuguard/ gpuguard/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/gpuguard \
 && /opt/gpuguard/bin/pip install /wheels/gpuguard-*.whl \
 && /opt/gpuguard/bin/pip uninstall --yes setuptools pip \
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
