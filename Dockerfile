# docker build --build-arg TORCH_VERSION=2.5.1 -t torch-error-cases .
# docker run --gpus all --shm-size=1g --rm -v "$PWD/outputs:/home/harness/app/outputs" torch-error-cases case=embedding_oob device=cuda
ARG TORCH_VERSION=2.5.1
ARG CUDA_TAG=cuda12.4-cudnn9-runtime
FROM pytorch/pytorch:${TORCH_VERSION}-${CUDA_TAG}

ARG TORCH_VERSION
RUN useradd --create-home --uid 1000 harness
WORKDIR /home/harness/app
COPY --chown=harness:harness pyproject.toml README.md ./
COPY --chown=harness:harness harness harness
COPY --chown=harness:harness cases cases
COPY --chown=harness:harness conf conf
COPY --chown=harness:harness tests tests
# Pin torch to the base image's own version so pip keeps it.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" -e ".[test]" && chown harness:harness /home/harness/app
USER harness
ENTRYPOINT ["python", "-m", "harness"]
CMD ["case=embedding_oob"]
