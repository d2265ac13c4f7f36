"""Cost-aware verification budget (`--budget auto`).

DARTree's fixed B verifies the same number of nodes every round, however confident the drafter is.
`AutoBudget` instead picks, per round, how many of the best-scoring supertree nodes to verify:

    n* = argmax_n  E[committed tokens | best n nodes] / t_round(n)

- The ranked nodes form a prefix-closed tree for every n (scores only fall along a path), and the
  accepted length is the number of accepted-path nodes inside the verified tree, so
  E[committed] = 1 + sum of P(node on the accepted path) over the n nodes.
- P(on path | path score) is calibrated on prompts the drafter never trained on, by replaying the
  supertree against greedy continuations (dartree.replay), binned by score and made monotone.
- t_round(n) = the round's fixed cost (draft, tree, commit) + t_verify(n + 1) from the measured cost
  curve of this machine.
- n is chosen only among the sizes the cost curve measured (n + 1 = a measured N): their costs are
  measured rather than interpolated, and a small fixed set of verify widths lets the packed CPU GEMMs
  (dartree.models.packed) keep one weight pack per width instead of re-packing (~0.3 s for the
  target) whenever a round picks a width not seen before. Verifying the whole supertree (W x depth
  nodes, fixed per W) and a single node are also choices.

The choice is one small batched computation over the sorted scores; reading n back is the one
extra host sync a round in auto mode makes.

One calibration per temperature band (dartree.defaults.TEMPERATURE_BANDS; `policy_for` refuses a file of
another band). At T > 0 a node is on the path only when the target's draws land on it, so the same score
is worth less: W = 12 supertrees replayed on the first 8 train prompts, 64 tokens, seed 0, scores at T
(`python scripts/temperature_scores.py --prompt-file ../shared/data/train_prompts.jsonl --limit 8
--temperatures 0,0.8 --seeds 0 --max-new-tokens 64 --calibration-width 12`,
assets/benchmarks/temperature/calibration.json), P(on path) in the score bins (-2.5, -2], (-2, -1.5],
(-1.5, -1], (-1, -0.5], above -0.5: T = 0: 0.074 0.109 0.281 0.507 0.813; T = 0.8: 0.039 0.064 0.067 0.281
0.602. The shipped policy is the greedy one; `sweep --temperature T --calibrate-out FILE` makes a band's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import isotonic_regression

from .defaults import default_shape, temperature_band
from .errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_POLICY = REPO_ROOT / "assets" / "benchmarks" / "auto-budget.json"


def monotone_rates(hits: list[float], counts: list[float]) -> list[float]:
    """Bin rates hits/counts made non-decreasing in score: SciPy's weighted isotonic regression
    (pool-adjacent-violators) over the bins that saw samples, weights = their counts.

    SciPy needs positive weights, so an empty bin takes the rate of the nearest non-empty bin below it
    (0 below the first): that is where pooling would put it, since it carries no weight of its own.
    """
    hits_a, counts_a = np.asarray(hits, dtype=float), np.asarray(counts, dtype=float)
    seen = counts_a > 0
    fitted = np.zeros_like(counts_a)
    if seen.any():
        fitted[seen] = isotonic_regression(hits_a[seen] / counts_a[seen], weights=counts_a[seen]).x
    last_seen = np.maximum.accumulate(np.where(seen, np.arange(len(counts_a)), -1))
    return np.where(last_seen >= 0, fitted[np.maximum(last_seen, 0)], 0.0).tolist()


DEFAULT_EDGES = (-16.0, -12.0, -10.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5)


def calibrate(samples, edges=DEFAULT_EDGES) -> dict:
    """P(on accepted path | score bin) from (scores [n], on_path [n] bool) pairs of replayed supertrees."""
    edges_t = torch.tensor(edges)
    hits = torch.zeros(len(edges) + 1)
    counts = torch.zeros(len(edges) + 1)
    for scores, on_path in samples:
        b = torch.bucketize(scores.float(), edges_t)
        counts += torch.bincount(b, minlength=len(edges) + 1).float()
        hits += torch.bincount(b, weights=on_path.float(), minlength=len(edges) + 1)
    return {"edges": list(edges), "rates": monotone_rates(hits.tolist(), counts.tolist()),
            "counts": counts.long().tolist()}


@dataclass
class AutoBudget:
    """The per-round budget rule, from a calibration and a cost curve of one machine."""

    edges: list
    rates: list
    fixed_seconds: float  # per round: draft + tree + commit
    verify_seconds: dict  # N -> seconds of one target forward over N tree tokens
    max_nodes: int = 256
    source: str = ""

    def __post_init__(self):
        from .replay import interpolate_verify

        self._edges = torch.tensor(self.edges)
        self._rates = torch.tensor(self.rates)
        n = torch.arange(1, self.max_nodes + 1)
        costs = {"verify_seconds": self.verify_seconds}
        self._round_seconds = torch.tensor([self.fixed_seconds + interpolate_verify(costs, int(k) + 1) for k in n],
                                           dtype=torch.float64)
        measured = {int(k) - 1 for k in self.verify_seconds if 1 <= int(k) - 1 <= self.max_nodes}
        self._allowed = torch.tensor([int(k) in measured for k in n]) if measured else torch.ones(len(n), dtype=torch.bool)
        self._allowed[0] = True  # a single node is always a choice, so every round has one

    @property
    def node_grid(self) -> list[int]:
        """The node counts a round may verify."""
        return [int(k) + 1 for k in torch.nonzero(self._allowed).flatten()]

    def expected_committed(self, scores_sorted: torch.Tensor) -> torch.Tensor:
        """[n] expected committed tokens when verifying the best 1..n nodes."""
        p = self._rates.to(scores_sorted.device)[torch.bucketize(scores_sorted.float(), self._edges.to(scores_sorted.device))]
        return 1.0 + torch.cumsum(p.double(), 0)

    def choose(self, scores: torch.Tensor) -> int:
        """How many of the nodes (scores of the non-root supertree nodes) to verify this round."""
        if scores.numel() == 0:
            return 0
        top = torch.sort(scores, descending=True).values[: self.max_nodes]
        rate = self.expected_committed(top) / self._round_seconds[: top.shape[0]].to(top.device)
        allowed = self._allowed[: top.shape[0]].clone()
        allowed[-1] = True  # or the whole supertree (a fixed size per W)
        rate = rate.masked_fill(~allowed.to(top.device), float("-inf"))
        return int(rate.argmax()) + 1

    def save(self, path: Path, extra: dict | None = None) -> None:
        data = asdict(self)
        data["verify_seconds"] = {str(k): v for k, v in self.verify_seconds.items()}
        data.update(extra or {})
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: Path) -> "AutoBudget":
        data = json.loads(Path(path).read_text())
        return cls(edges=data["edges"], rates=data["rates"], fixed_seconds=float(data["fixed_seconds"]),
                   verify_seconds={int(k): float(v) for k, v in data["verify_seconds"].items()},
                   max_nodes=int(data.get("max_nodes", 256)), source=str(data.get("source", path)))


_POLICIES: dict = {}


def policy_for(target, drafter_name: str, path: Path | None = None, temperature: float = 0.0) -> AutoBudget:
    """The auto-budget policy for these models on this kind of device and temperature band, loaded once per process.

    The shipped calibration belongs to the embedded target, the shipped drafter, a CPU and greedy decoding
    (T = 0); anything else needs its own (`python -m dartree sweep [--temperature T] --calibrate-out FILE`),
    since the acceptance rates change with the models and the temperature, and the cost curve with the
    machine. A file records the temperature it was calibrated at (absent: 0), and serves its band of
    dartree.defaults.TEMPERATURE_BANDS: P(on path | score) is not the same at T > 0 (the module docstring).
    """
    path = Path(path) if path is not None else SHIPPED_POLICY
    key = (str(path), target.name, drafter_name, target.device.type, temperature_band(temperature))
    if key in _POLICIES:
        return _POLICIES[key]
    if not path.is_file():
        raise UserError(f"--budget auto needs a calibration file; {path} does not exist "
                        "(make one with `python -m dartree sweep --calibrate-out FILE`)")
    data = json.loads(path.read_text())
    want = {"target": target.name, "drafter": drafter_name, "device": target.device.type}
    for k, v in want.items():
        if data.get(k) != v:
            raise UserError(f"--budget auto: {path} was calibrated for {k} {data.get(k)!r}, not {v!r}; "
                            "make one for these models with `python -m dartree sweep --calibrate-out FILE`")
    calibrated = float(data.get("temperature", 0.0))
    if temperature_band(calibrated) != temperature_band(temperature):
        raise UserError(f"--budget auto: {path} was calibrated at temperature {calibrated:g}, outside the band of "
                        f"{temperature:g} (dartree.defaults.TEMPERATURE_BANDS); make one with `python -m dartree "
                        f"sweep --temperature {temperature:g} --calibrate-out FILE`")
    _POLICIES[key] = AutoBudget.load(path)
    return _POLICIES[key]


def shape_for(models, temperature: float = 0.0) -> dict:
    """`default_shape` of the models' device at this temperature, with the auto budget kept only where a
    calibrated policy fits these models: another drafter or a GPU falls back to its fixed B instead of an error."""
    shape = default_shape(models.target.device.type, temperature)
    if shape.get("auto_budget"):
        try:
            policy_for(models.target, models.drafter_name, temperature=temperature)
        except UserError:
            shape["auto_budget"] = False
    return shape
