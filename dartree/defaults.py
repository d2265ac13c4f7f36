"""Default tree shape per device.

CPU: to be replaced by the best (W, B) measured by `python -m dartree bench` on this CPU (issue: speed).
CUDA: the DARTree reference's defaults (W = 12, B = 64, C = 64): a GPU verifies 64 tokens for little
more than the cost of one.
"""

CPU_DEFAULTS = {"width": 8, "budget": 32, "candidates": 64}
GPU_DEFAULTS = {"width": 12, "budget": 64, "candidates": 64}
