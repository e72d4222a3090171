# syntax=docker/dockerfile:1
# A CI / Kubernetes warmer: the Neuron SDK image (neuronx-cc, torch-neuronx) plus neffcache.
# It runs on CPU hosts: `neffcache warm` sets TORCH_NEURONX_COMPILE_ONLY=1 and
# NEURON_RT_FAKE_INSTANCE_TYPE, so no Neuron device is needed to compile.
#
#   docker build -f deploy/docker/warmer.Dockerfile \
#       --build-arg NEURON_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:<tag> \
#       -t neffcache-warmer .                                                    (from the repo root)
#
# NEURON_IMAGE may also be your own training image built FROM a Neuron DLC: the warmer then
# has your model code and its dependencies, and `neffcache warm -- python train.py` just works.
# Pin it to an exact tag: the tag decides the neuronx-cc version, and so the cache namespace.
ARG NEURON_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:2.9.0-neuronx-py312-sdk2.31.0-ubuntu24.04

# neffcache is built as a wheel in a stage of its own so the Neuron image gets no build tooling or
# source. The stage starts from the Neuron image too: the wheel carries the C listing helper
# (neffcache/stores/_listdir.c), compiled for exactly the python3 the last stage installs it into.
# The helper is optional to pip (a host without a compiler installs without it and every scan
# lists at a third of the speed), so this stage installs gcc and the headers, and fails the build
# unless `neffcache --version` says the helper loads.
FROM ${NEURON_IMAGE} AS wheel
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY neffcache/ neffcache/
COPY cli/ cli/
COPY server/ server/
COPY warmers/ warmers/
RUN python3 -m venv /tmp/build \
    && /tmp/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
    && /tmp/build/bin/pip install --no-cache-dir "$(ls /dist/neffcache-*.whl)" \
    && /tmp/build/bin/neffcache --version | grep -x "native listing: active"

FROM ${NEURON_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel /dist/ /tmp/dist/
# neffcache gets its own venv, made with the image's python3 (needs >= 3.11): its click/httpx/boto3
# can never clash with the versions the Neuron SDK pins, and only the `neffcache` entry point goes
# on PATH, so `python` in `neffcache warm -- python train.py` is still the SDK's interpreter.
RUN python3 -m venv /opt/neffcache \
    && /opt/neffcache/bin/pip install --no-cache-dir --disable-pip-version-check \
       "$(ls /tmp/dist/neffcache-*.whl)[s3]" \
    && ln -s /opt/neffcache/bin/neffcache /usr/local/bin/neffcache \
    && rm -rf /tmp/dist \
    && neffcache --version | grep -x "native listing: active"
# Non-root, with a fixed uid/gid: the FSx mount is group-writable (neffcache's shared mode writes
# 0o664 files in setgid 0o2775 directories), so give the pods fsGroup 10001.
RUN groupadd --gid 10001 neffcache \
    && useradd --uid 10001 --gid neffcache --create-home --home-dir /home/neffcache --shell /bin/bash neffcache \
    && mkdir -p /workspace /var/cache/neuron \
    && chown neffcache:neffcache /workspace /var/cache/neuron
ENV NEFFCACHE_STORES=/var/cache/neuron \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /workspace
# No ENTRYPOINT: CI systems run their own shell in this image (GitLab's `image:`, `docker run
# IMAGE neffcache warm ...`), and Kubernetes manifests name the command explicitly.
CMD ["neffcache", "--help"]
