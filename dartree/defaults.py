"""Default tree shape per device.

CPU: measured by `python -m dartree bench --limit 30 --spread --max-new-tokens 128 --best-of
assets/benchmarks/sweep-cpu.json` (assets/benchmarks/bench-cpu.json, the shipped 16k-vocabulary drafter):
the sweep's best fixed budget was B = 8 for every tree method; dartree W = 4, B = 8 ran at 1.54x plain
decoding (per-prompt median 1.49x), its cost-aware budget (W = 4) at 1.53x, so the fixed budget is the default and `auto_budget` is off (it stays
one click or `--budget auto` away). See docs/speed.md, "Speed on this CPU".
CPU depth bonus (dartree's top-B cut ranks nodes by path score + bonus x depth): -0.2, the best of 0, -0.1
and -0.2 by τ replayed on the same 30 dev prompts, speeds predicted from the committed cost curve
(`python -m dartree sweep --limit 30 --spread --max-new-tokens 128 --threads 1 --configs
ar,dartree:W=4:B=8:bonus=0,...,dartree:W=12:B=32:bonus=-0.2 --costs assets/benchmarks/sweep-cpu.json`,
assets/benchmarks/depth-bonus-cpu.json): W = 4, B = 8: τ 2.3235 / 2.3317 / 2.3333 (44.40 / 44.55 / 44.58
predicted tok/s); W = 12, B = 32: τ 2.7099 / 2.7232 / 2.7299. A small but consistent gain, and the
reference's value.
Drafter v2 (stop 23, issue #21; docs/training.md): the shipped drafter changed after these sweeps. Its dev bench
(assets/benchmarks/drafter-v2/dev.json) keeps W = 4, B = 8 ahead: 2.10x with retrieval (τ 3.35), 1.53x without
(τ 2.40), against W = 12, B = 32's 1.21x (τ 2.86). Its bonus, re-swept (the sweep above with --drafter and
--configs ar,dartree:bonus=0,...,dartree:bonus=-0.3,dartree:W=4:B=8:retrieval=none:bonus=0,...:bonus=-0.2;
assets/benchmarks/drafter-v2/depth-bonus.json): with retrieval τ 3.3859 / 3.3518 / 3.3518 / 3.2791 at 0 / -0.1 /
-0.2 / -0.3 (predicted 2.340x / 2.334x / 2.340x / 2.290x); without, 2.3886 at 0 and 2.4007 at -0.2. No value wins
both, and the predicted speeds tie: -0.2 stays.
Re-swept on each shipped drafter since (docs/training.md); with the stop-42 drafter -0.1 leads on both prompt
sets at the default (retrieval on): dev τ 3.4173 / 3.4173 / 3.3894 / 3.3384 at 0 / -0.1 / -0.2 / -0.3 (predicted
2.389x / 2.408x / 2.381x / 2.347x), dev_long 2.9812 / 3.0076 / 2.9812 / 2.9590 (2.055x / 2.084x / 2.073x / 2.072x);
without retrieval dev 2.5113 / 2.5132 / 2.5019 and dev_long 2.2571 / 2.2679 / 2.2722 at 0 / -0.1 / -0.2; W = 12,
B = 32 ties from -0.1 to -0.3 (2.9821); at T = 0.8 and 1.0 (replayed on sampled continuations) -0.1 and -0.2 tie
(2.1848 / 2.1848, 1.6282 / 1.6289). So the CPU default is -0.1 (`python -m dartree sweep --limit 30 --spread
--max-new-tokens 128 --configs ar,dartree:bonus=0,...,dartree:bonus=-0.3,... --costs assets/benchmarks/sweep-cpu.json`;
assets/benchmarks/drafter-v2-mix/depth-bonus*.json).
CUDA: the DARTree reference's defaults (W = 12, B = 64, C = 64, and the depth bonus -0.2 of its pruned
runs): a GPU verifies 64 tokens for little more than the cost of one.
"""

CPU_DEFAULTS = {"width": 4, "budget": 8, "candidates": 64, "auto_budget": False, "depth_bonus": -0.1,
                "continuity": 0.1}
AUTO_BUDGET_CAP = 256  # the most nodes an automatic budget may verify (the cost curve's last point)
GPU_DEFAULTS = {"width": 12, "budget": 64, "candidates": 64, "depth_bonus": -0.2, "continuity": 0.0}


def default_shape(device_type: str, temperature: float = 0.0) -> dict:
    """The measured best shape for this CPU at this decoding temperature; the DARTree reference's GPU
    defaults on CUDA.

    The one source of defaults: `DecodeSettings` resolves its unset fields from it (dartree.engine), and
    the CLI and the app take it through `dartree.budget.shape_for` (which also checks the auto budget)."""
    if device_type == "cuda":
        return dict(GPU_DEFAULTS)
    return {**CPU_DEFAULTS, **CPU_SAMPLING_SHAPES[temperature_band(temperature)]}

# Retrieval branches (dartree.retrieval): on by default, context n-grams (`--retrieval ngram`; `none` turns them
# off). Measured in one interleaved bench per prompt set (fp32, dartree W = 4, B = 8, bonus -0.2, 30 prompts x
# 128 tokens, all outputs identical to plain decoding, `python -m dartree bench --limit 30 --spread
# --max-new-tokens 128 --configs dartree:W=4:B=8:retrieval=none,...=ngram,...=table,...=both`, and the same
# with --prompt-file ../shared/data/dev_long_prompts.jsonl; assets/benchmarks/archive/stop18/retrieval-dev*.json):
#   dev       none τ 2.33, 1.58x | ngram τ 3.36, 2.23x | table τ 2.84, 1.87x | both τ 3.35, 2.19x
#   dev_long  none τ 1.96, 1.34x | ngram τ 2.84, 1.90x | table τ 2.40, 1.60x | both τ 2.86, 1.88x
# ngram is the fastest on both sets and gains on every dev source (GSM8K 2.30 -> 2.33x, HumanEval 1.49 ->
# 2.48x, self-instruct 1.46 -> 2.05x); the table adds nodes for no gain over it. So the default is ngram.
# Re-measured with the train-derived priors below and the written-out forward (`--configs
# dartree,dartree:retrieval=none`, assets/benchmarks/archive/stop19/retrieval-dev*.json, docs/speed.md section 9):
#   dev       none τ 2.33, 1.56x | ngram τ 3.36, 2.14x (GSM8K 2.22 -> 2.18x, HumanEval 1.50 -> 2.51x,
#             self-instruct 1.44 -> 1.93x)
#   dev_long  none τ 1.96, 1.22x | ngram τ 2.85, 1.84x
# RETRIEVAL_PRIORS are the prior acceptance rates P(node accepted | parent accepted): n-grams by match length
# n = 1..4, the successor table by column at depth 1 and one rate for its chains below; each is worth
# RETRIEVAL_PRIOR_WEIGHT observations of the online counts. Derived from TRAIN prompts only (rows below
# 18,515; never dev), as the acceptance rates of the retrieved nodes the cut kept whose parent was accepted,
# T = 0, dartree W = 4, B = 8, retrieval both, 128 new tokens:
#   `python scripts/retrieval_priors.py --per-family 2 --long 4` (12 rows: the first 2 short rows of each
#   source family and the first 4 long-document rows of the file; rows 0-4, 6, 7, 10, 36, 37, 41, 48;
#   321 rounds, τ 3.41), accepted / seen:
#   ngram n = 1..4: 69/211 0.33, 49/81 0.60, 21/30 0.70, 603/649 0.93;
#   table columns 0..3: 104/212 0.49, 10/70 0.14, 7/55 0.13, 3/32 0.09; table chains 194/249 0.78.
# Close to the earlier dev-picked values (0.2 / 0.6 / 0.75 / 0.9; 0.55 / 0.08 x 3; 0.7); dev τ with them: 3.36,
# as before (above). The script's default (24 rows) is the fuller run.
RETRIEVAL_DEFAULT = "ngram"
RETRIEVAL_PRIORS = {"ngram": (0.33, 0.6, 0.7, 0.93), "table": (0.49, 0.14, 0.13, 0.09), "table_chain": 0.78}
RETRIEVAL_PRIOR_WEIGHT = 4.0

# DART's n-gram continuity term (dartree.continuity): P from the trigrams of the target's own committed answers
# (6.0 M response tokens), DART's longest-context rule and eps. Its weight is a shape default above ("continuity";
# the DARTree reference leaves the term off on GPUs, and uses DART's 0.5 when on). CPU weight, by τ replayed on
# the 30 dev and 30 dev_long prompts (T = 0, 128 tokens, the stop-42 drafter, bonus -0.1; `python -m dartree
# sweep --limit 30 --spread --max-new-tokens 128 --configs ar,dartree:W=4:B=8:retrieval=none:continuity=W,...,
# dartree:continuity=W,... --costs assets/benchmarks/sweep-cpu.json`, and with --prompt-file
# ../shared/data/dev_long_prompts.jsonl; assets/benchmarks/continuity/sweep-*.json):
#   weight               0       0.03    0.05    0.08    0.1     0.12    0.15    0.2
#   dev, drafter alone   2.5132  2.5440  2.5715  2.5755  2.5696  2.5636  2.5577  2.5324   (W = 4, B = 8)
#   dev_long, alone      2.2679  2.3142  2.3392  2.3719  2.3766  2.3790  2.3648  2.3508
#   dev, default         3.4173          3.4926          3.4926          3.5260           (n-gram retrieval)
#   dev_long, default    3.0076          3.0856          3.0936          3.0539
#   dev, W = 12, B = 32  2.9821          3.0393          3.0172                           (DDTree B = 32: 2.6923)
# DART's own 0.5 loses (dev alone 2.36 in a first, uncommitted prototype of the term): with this small corpus an
# unseen continuation costs 0.5 x log(1e-10) = -11.5. 0.1 leads dev_long at the default and holds dev's best
# default and most of the drafter-alone gain, so the CPU weight is 0.1. The depth bonus, re-swept with it at the
# default (bonus 0 / -0.1 / -0.2): dev 3.4926 / 3.4926 / 3.5074, dev_long 3.0776 / 3.0936 / 3.0697; -0.1 stays.
CONTINUITY_ORDER = 3
CONTINUITY_EPS = 1e-10

# Sampling (T > 0, issue #24). The walk accepts a child when the target's draw from its processed distribution
# (temperature, top-p) lands on it, so fewer nodes are accepted than at T = 0 and the scores that rank them
# change: they are processed at `score_temperature(T)` (dartree.tree.child_log_probs: the derivation), and the
# shape has a temperature axis, one entry per band of TEMPERATURE_BANDS (upper bounds; T = 0 is greedy).
# Measured by τ replayed on sampled continuations (dartree.replay), the first 16 train prompts (the trainer's
# held-out slice), 96 tokens, seeds 0 and 1, dartree W = 4, B = 8, bonus -0.2 (`python scripts/temperature_scores.py
# --prompt-file ../shared/data/train_prompts.jsonl --limit 16 --temperatures 0.8 --seeds 0,1 --max-new-tokens 96
# --configs dartree:W=4:B=8 --scores none,x1,x1.5`, and --temperatures 1.0; assets/benchmarks/temperature/):
#   T = 0.8: drafted scores τ 1.9890 | processed at T (x1) 1.9642 (-0.011 ± 0.016 SE, 32 paired runs) |
#            at 1.5 T (x1.5) 2.0208 (+0.031 ± 0.010); per seed 2.0861 / 1.9070, 2.0753 / 1.8716, 2.1301 / 1.9294
#   T = 1.0: drafted = at T 1.6542 | at 1.5 T 1.6769 (+0.018 ± 0.010); per seed 1.6873 / 1.6223, 1.7212 / 1.6347
# Flatter still loses at T = 0.8 (`... --scores x1.5,x2,x2.5`, scales-T0.8.json): 2 T τ 2.0096 (-0.030 ± 0.016
# against 1.5 T), 2.5 T 1.9858 (-0.073 ± 0.033); at T = 1.0, seed 0 only (`--temperatures 1.0 --seeds 0 --scores
# x1.5,x2`, scales-T1.0.json): 1.5 T 1.7212, 2 T 1.7166 (-0.008 ± 0.011, 16 runs). Predicted speedups (`--predict` below) of W = 4, B = 8 at T = 0.8:
# drafted scores 1.402x, at T 1.385x, at 1.5 T 1.425x.
# Shapes at T = 0.8 (scores at T; `... --scores x1 --configs dartree:W=4:B=8,dartree:W=4:B=8:bonus=0,...,chain`,
# shapes-T0.8.json), speedups PREDICTED from the committed cost curve (`python scripts/temperature_scores.py
# --predict assets/benchmarks/temperature/shapes-T0.8.json --costs assets/benchmarks/sweep-cpu.json`):
#   W = 4, B = 8, bonus -0.2 / -0.1 / 0: τ 1.9642 / 1.9520 / 1.9341, 1.385x / 1.376x / 1.364x | W = 4, B = 4: 1.8106,
#   1.361x | W = 4, B = 16: 2.0825, 1.233x | W = 8, B = 16: 2.1139, 1.244x | chain: 1.7170, 1.233x
# Shapes at T = 1.0 (scores at 1.5 T, `... --temperatures 1.0 --scores x1.5 --configs dartree:W=4:B=8,
# dartree:W=4:B=4,dartree:W=8:B=16,chain`, shapes-T1.0.json, predicted as above): W = 4, B = 8: τ 1.6769, 1.182x |
# W = 4, B = 4: 1.5896, 1.195x (verify of 5 nodes interpolated, not measured) | W = 8, B = 16: 1.8056, 1.063x |
# chain: 1.4618, 1.050x.
# So the greedy shape (W = 4, B = 8, bonus -0.2) stays the best measured at T = 0.8; at T = 1.0, B = 4 is
# predicted 1 % faster, inside the noise, so the bands hold no overrides yet: the quiet-machine bench per
# temperature (docs/speed.md) confirms or replaces them.
# Re-swept at T = 0.8 on dev with today's costs (stop 21: a verify of 1-3 tokens costs one token's 23.4 ms, since
# one weight stream serves them, then 24.2 / 26.1 / 28.1 ms at 4 / 5 / 9; the draft head on the GGUF's Q8_0 rows;
# the builder's early stop), n-gram retrieval on, speeds predicted from the cost curve this run measured
# (`python -m dartree sweep --limit 30 --spread --max-new-tokens 128 --temperature 0.8 --configs ar,dartree:W=4:B=8,
# dartree:W=4:B=6,dartree:W=4:B=4,dartree:W=4:B=3,dartree:W=4:B=2,dartree:W=2:B=2,dartree:W=3:B=3,dartree:W=8:B=4`,
# DARTREE_WEIGHTS=fp32, assets/benchmarks/temperature/sweep-T0.8.json): W = 4, B = 8: τ 2.15, 1.49x | B = 6: 2.06,
# 1.49x | B = 4: 1.91, 1.42x | B = 3: 1.80, 1.43x | B = 2: 1.66, 1.35x | W = 2, B = 2: 1.66, 1.34x | W = 3, B = 3:
# 1.81, 1.42x | W = 8, B = 4: 1.91, 1.41x. The cheap 3-token verify does not pay for the τ a small tree loses:
# the greedy shape stays the T = 0.8 default.
# Shapes at T = 0.5 (stop 37; replayed, scores at 1.5 T, n-gram retrieval, speeds predicted from the committed
# cost curve: `python -m dartree sweep --limit 30 --spread --max-new-tokens 128 --temperature 0.5 --configs
# ar,chain,ddtree:B=8,dartree:W=4:B=8,...,dartree:W=4:B=8:bonus=0 --costs assets/benchmarks/sweep-cpu.json`,
# DARTREE_WEIGHTS=fp32, assets/benchmarks/temperature/sweep-T0.5.json): W = 4, B = 8: τ 2.73, 1.90x | bonus 0: 2.74,
# 1.90x | B = 6: 2.60, 1.86x | B = 4: 2.33, 1.74x | B = 16: 2.98, 1.73x | W = 8, B = 16: 3.00, 1.74x | W = 8, B = 4:
# 2.33, 1.73x | W = 2, B = 2: 1.94, 1.50x | chain 1.84, 1.32x | ddtree B = 8 1.95, 1.44x (both without retrieval).
# So the middle band keeps the greedy shape too.
TEMPERATURE_BANDS = (0.0, 0.65, 2.0)  # 2.0: the engine's MAX_TEMPERATURE
CPU_SAMPLING_SHAPES = ({}, {}, {})  # per band: the fields that differ from CPU_DEFAULTS
SCORE_TEMPERATURE_SCALE = 1.5  # score temperature / decoding temperature (the k of dartree.tree.child_log_probs)


def temperature_band(temperature: float) -> int:
    """Index of the band of TEMPERATURE_BANDS that holds `temperature` (0: greedy)."""
    return next((i for i, upper in enumerate(TEMPERATURE_BANDS) if temperature <= upper), len(TEMPERATURE_BANDS) - 1)


def score_temperature(temperature: float) -> float:
    """The temperature the tree's scores are processed at when decoding at `temperature` (0: as drafted)."""
    return 0.0 if temperature <= 0 else SCORE_TEMPERATURE_SCALE * temperature
