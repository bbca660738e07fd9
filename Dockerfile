# One image for every flextrain process: the operator, a job's master, its workers and its
# parameter servers (the pod's args pick the role: `operator`, `master ...`, `worker ...`, `ps ...`).
#
#   docker build -t flextrain:0.1.0 .                                # CPU PyTorch
#   docker build -t flextrain:0.1.0-tf --build-arg EXTRAS=tensorflow .   # + tensorflow-cpu for Keras modules
#
# CUDA variant: PyTorch's CUDA wheels bundle the CUDA runtime and libraries, so the slim base stays;
# the node needs the NVIDIA driver and the NVIDIA container toolkit (device plugin on Kubernetes).
# Pick the wheel index of the CUDA version you run (https://download.pytorch.org/whl/ lists them):
#   docker build -t flextrain:0.1.0-cuda --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
# and request GPUs in the ElasticJob: replicaSpecs.worker.resources.limits: {nvidia.com/gpu: 1}.
# Workers pick NCCL when CUDA is available (flextrain/worker/collective.py). CI has no GPU: the CUDA
# variant is a documented starting point, not a tested configuration.
#
# CI does not build this image (no container engine there); tests/k8s_static/test_dockerfile.py
# checks the facts below statically: pinned torch, non-root user, `flextrain` entrypoint.

FROM python:3.11-slim

# The CPU wheel index by default; pip must never resolve a multi-GB CUDA build by accident.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional extras of the flextrain package, e.g. "tensorflow".
ARG EXTRAS=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, in its own layer: it is by far the largest and changes least often.
# Keep the version equal to pyproject.toml's pin (a test checks it).
RUN pip install torch==2.13.0 --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/flextrain
COPY pyproject.toml README.md ./
COPY flextrain ./flextrain
RUN pip install ".${EXTRAS:+[${EXTRAS}]}"

# The example model-zoo modules, at the paths manifests/examples/*.yaml name.
COPY model_zoo ./model_zoo

# Non-root: a fixed uid/gid (10001) so pod securityContexts (runAsUser, fsGroup) can name it.
# /flextrain-jobs is the default job directory (ElasticJob spec.jobDir); mount a volume there to keep it.
RUN groupadd --gid 10001 flextrain \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/flextrain flextrain \
    && mkdir -p /flextrain-jobs \
    && chown flextrain:flextrain /flextrain-jobs
USER 10001:10001

# gRPC ports: a job's master (50051) and its parameter servers (50061); see flextrain/k8s/meta.py.
EXPOSE 50051 50061

ENTRYPOINT ["flextrain"]
CMD ["--help"]
