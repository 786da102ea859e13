# docker build --build-arg TORCH_VERSION=2.5.1 --build-arg CUDA_TAG=cuda12.4-cudnn9-runtime -t torch-error-cases .
# docker run --gpus all --shm-size=1g --rm -v "$PWD/outputs:/home/harness/app/outputs" torch-error-cases case=embedding_oob device=cuda
# TORCH_VERSION and CUDA_TAG must together name a pytorch/pytorch tag (e.g. 2.3.1 with cuda12.1-cudnn8-runtime).
# --shm-size: DDP ranks (multigpu_segfault) exchange tensors through /dev/shm, 64 MB by default under docker.
ARG TORCH_VERSION=2.5.1
ARG CUDA_TAG=cuda12.4-cudnn9-runtime
FROM pytorch/pytorch:${TORCH_VERSION}-${CUDA_TAG}

ARG TORCH_VERSION
# The uid the harness runs as: --build-arg HARNESS_UID="$(id -u)" keeps records in a mounted outputs/ yours.
ARG HARNESS_UID=1000
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN useradd --create-home --uid "${HARNESS_UID}" harness
WORKDIR /home/harness/app
COPY --chown=harness:harness pyproject.toml README.md ./
COPY --chown=harness:harness harness harness
COPY --chown=harness:harness cases cases
COPY --chown=harness:harness conf conf
COPY --chown=harness:harness hydra_plugins hydra_plugins
COPY --chown=harness:harness tests tests
# Pin torch to the base image's own version so pip keeps it; editable, as the harness reads conf/ and cases/ from here.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" -e ".[test]" && chown harness:harness /home/harness/app
USER ${HARNESS_UID}
ENTRYPOINT ["python", "-m", "harness"]
CMD ["case=embedding_oob"]
