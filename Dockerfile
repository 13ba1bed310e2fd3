# syntax=docker/dockerfile:1
# The container image of `deepseek-tfx compile-kfp` (Kubeflow Pipelines v2): every
# pipeline task runs in it. The project is installed at /opt/deepseek-tfx
# (pipeline/kubeflow_runner.py, CONTAINER_PROJECT_DIR), from the locked dependencies.
#
#   docker build -t deepseek-tfx:latest .
#   docker run --rm deepseek-tfx:latest python -c "import components.trainer.component, pipeline.pipeline"
#
# Python 3.10.13 on Debian bookworm (glibc 2.36), as the project's own venv;
# TFX 1.16's wheels need Python 3.10 and TFX 1.21's need glibc 2.38.
FROM python:3.10.13-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3.10 \
    TF_CPP_MIN_LOG_LEVEL=2

RUN python -m pip install --no-cache-dir uv==0.13.9

WORKDIR /opt/deepseek-tfx

# Dependencies first (a layer that changes only with uv.lock), then the project.
# No compiler needed: the packages uv.lock has only as sdists are pure Python
# (crcmod falls back to its pure-Python CRC when its C extension cannot build).
COPY pyproject.toml uv.lock ./
RUN uv sync --locked --no-dev --no-install-project --no-cache

# The default corpus of `compile-kfp` (kubeflow_runner.CONTAINER_CORPUS).
ADD --chmod=644 https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt \
    data/corpora/tinyshakespeare.txt

COPY . .
RUN uv sync --locked --no-dev --no-cache

# KubeflowV2DagRunner's tasks run `python -m tfx.orchestration.kubeflow.v2.container.
# kubeflow_v2_run_executor`: `python` must be the project's venv.
ENV PATH=/opt/deepseek-tfx/.venv/bin:$PATH \
    VIRTUAL_ENV=/opt/deepseek-tfx/.venv

RUN python -c "import components.trainer.component, pipeline.pipeline; \
from pipeline.kubeflow_runner import CONTAINER_SCHEMA_FILE; import os; \
assert os.path.isfile(CONTAINER_SCHEMA_FILE), CONTAINER_SCHEMA_FILE"

CMD ["deepseek-tfx", "--help"]
