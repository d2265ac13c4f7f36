#!/usr/bin/env bash
# Keep a preset's data stage fed, in stages of under an hour, until every shard of its plan exists.
#
#   scripts/datagen_stages.sh [PRESET] [MINUTES]      (defaults: smollm2-cpu-v2, 40)
#
# Each stage is one `--stage data --max-minutes MINUTES` process: after MINUTES it starts no new shard and
# finishes the started ones (about one shard more), then exits; finished shards are skipped on the next
# stage, so the loop, or a later session, can stop and restart at any time and loses at most the shards
# in flight. The loop ends when a stage writes no new shard (the plan is complete) or a stage fails.
# Low priority on shared cores: nice 19, and passive OpenMP threads (no spinning).
# Environment: PYTHON (default .venv/bin/python), and the usual DARTREE_TRAIN_TOKENS / DARTREE_DATA /
# DARTREE_CACHE to put the token shards, the prompt files and the features elsewhere.
set -u
cd "$(dirname "$0")/.."
PRESET=${1:-smollm2-cpu-v2}
MINUTES=${2:-40}
PY=${PYTHON:-.venv/bin/python}
TOKENS=${DARTREE_TRAIN_TOKENS:-assets/train_data}/$PRESET
count() { ls "$TOKENS"/tokens-*.npz 2>/dev/null | wc -l; }
while true; do
  before=$(count)
  echo "[stages] $(date -u +%FT%TZ) stage starts with $before shards"
  OMP_WAIT_POLICY=PASSIVE nice -n 19 "$PY" -m dartree train --preset "$PRESET" --stage data \
    --max-minutes "$MINUTES" --no-progress || { echo "[stages] stage failed ($?)"; exit 1; }
  after=$(count)
  echo "[stages] $(date -u +%FT%TZ) stage ended with $after shards"
  [ "$after" -gt "$before" ] || { echo "[stages] no new shard: the plan is complete"; exit 0; }
done
