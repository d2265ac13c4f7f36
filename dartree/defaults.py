"""Default tree shape per device.

CPU: measured by `python -m dartree bench --limit 30 --spread --max-new-tokens 128 --best-of
assets/benchmarks/sweep-cpu.json` (assets/benchmarks/bench-cpu.json): the sweep's best fixed budget was
B = 8 for every tree method, and dartree's cost-aware budget at W = 4 beat dartree's best fixed
configuration (W = 8, B = 8) in the same interleaved run (0.83x against 0.81x plain decoding; median
per-prompt 0.90x against 0.87x), so `auto_budget` is on. B is then the cap of the auto budget in the
app (the CLI's `--budget auto` caps at 256; in the bench it verified 8.1 nodes a round on average) and
the budget of the fixed-B methods. Both ratios are below 1: see README, "Speed on this CPU".
CUDA: the DARTree reference's defaults (W = 12, B = 64, C = 64): a GPU verifies 64 tokens for little
more than the cost of one.
"""

CPU_DEFAULTS = {"width": 4, "budget": 8, "candidates": 64, "auto_budget": True}
GPU_DEFAULTS = {"width": 12, "budget": 64, "candidates": 64}


def default_shape(device_type: str) -> dict:
    """The measured best shape for this CPU; the DARTree reference's GPU defaults on CUDA."""
    return dict(GPU_DEFAULTS if device_type == "cuda" else CPU_DEFAULTS)


def shape_for(models) -> dict:
    """`default_shape` of the models' device, with the auto budget kept only where a calibrated policy
    fits these models: another drafter or a GPU falls back to its fixed B instead of an error."""
    shape = default_shape(models.target.device.type)
    if shape.get("auto_budget"):
        from .budget import policy_for
        from .errors import UserError

        try:
            policy_for(models.target, models.drafter_name)
        except UserError:
            shape["auto_budget"] = False
    return shape
