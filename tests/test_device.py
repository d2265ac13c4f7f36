"""The GPU path, checked on a CPU-only machine.

- device and dtype resolution: CUDA asked for without one is a user error, bf16 on CUDA, fp32 on CPU;
- everything a Decoder creates lives on the target's device (no factory call without `device=`), with the
  dtypes the records promise, also when the models run in bf16 as they do on a GPU;
- host synchronisation: a depth step of the tree builders must not copy anything to the host, and a whole
  round must sync a small number of times that does not grow with W or B. A sync is counted at the
  aten level (item / is_nonzero / nonzero / boolean indexing / data-dependent shapes / copies to the CPU),
  plus `tolist` / `numpy` / `torch.tensor` from host data and `torch.cuda.synchronize`.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from dartree import tree as tree_mod
from dartree.engine import Decoder, DecodeSettings, generate
from dartree.errors import UserError
from dartree.models import target as target_mod
from dartree.models.target import Target, load_target, resolve_device, resolve_dtype
from dartree.trace import DepthRecord, DraftRecord, TreeRecord, VerifyRecord
from tiny import tiny_drafter, tiny_target

PACKAGE = str(Path(target_mod.__file__).resolve().parents[1])  # .../dartree
PROMPT = [3, 17, 5, 22, 9, 41, 8, 30]


# ---------------------------------------------------------------------------------------------- resolution
@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda_is_a_user_error(no_cuda, device):
    with pytest.raises(UserError, match="no CUDA device"):
        resolve_device(device)


def test_device_names(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "tpu", "mps", ""):
        with pytest.raises(UserError, match="unknown device"):
            resolve_device(bad)


def test_auto_picks_cuda_when_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:0") == torch.device("cuda:0")


def test_dtype_defaults_and_refusals():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype(None, cuda) == resolve_dtype("auto", cuda) == torch.bfloat16
    assert resolve_dtype(None, torch.device("cuda:1")) == torch.bfloat16
    assert resolve_dtype(None, cpu) == resolve_dtype("auto", cpu) == resolve_dtype("fp32", cpu) == torch.float32
    assert resolve_dtype("fp16", cuda) == torch.float16 and resolve_dtype("fp32", cuda) == torch.float32
    for half in ("fp16", "bf16", "float16", "bfloat16"):
        with pytest.raises(UserError, match="only fp32"):
            resolve_dtype(half, cpu)
    with pytest.raises(UserError, match="unknown dtype"):
        resolve_dtype("int8", cpu)


def test_load_target_refuses_before_loading_anything(no_cuda, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the target was resolved although the device/dtype is refused")

    monkeypatch.setattr(target_mod, "resolve_target_path", boom)
    with pytest.raises(UserError, match="no CUDA device"):
        load_target(device="cuda")
    with pytest.raises(UserError, match="only fp32"):
        load_target(device="cpu", dtype="bf16")


# ---------------------------------------------------------------------------------------------- placement
FACTORIES = {"tensor", "as_tensor", "arange", "full", "zeros", "ones", "empty", "rand", "randn", "randint",
             "randperm", "eye", "linspace", "logspace", "empty_strided", "scalar_tensor"}


def caller_in_package() -> str | None:
    """`file:line` of the innermost frame in dartree/ (None when the call comes from elsewhere)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE):
            return f"{Path(name).relative_to(PACKAGE).as_posix()}:{frame.f_lineno}"
        if "/torch/" not in name and "/transformers/" not in name and name != __file__:
            return None
        frame = frame.f_back
    return None


class FactoryWatch(TorchFunctionMode):
    """Records tensor factory calls made by dartree code without an explicit device."""

    def __init__(self):
        super().__init__()
        self.undevised = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in FACTORIES and kwargs.get("device") is None:
            where = caller_in_package()
            if where is not None:
                self.undevised.append(f"torch.{func.__name__} at {where}")
        return func(*args, **kwargs)


def run_all_stages(target, drafter, settings, prompt=PROMPT):
    dec = Decoder(target, drafter, prompt, settings)
    records = [dec.prefill()]
    while dec.next_stage != "done":
        records.append(dec.step())
    return dec, records


@pytest.fixture(scope="module")
def tiny():
    t = tiny_target()
    return t, tiny_drafter(t)


@pytest.mark.parametrize("method", ["ar", "chain", "ddtree", "dartree-fixed", "dartree"])
def test_every_tensor_the_decoder_makes_names_its_device(tiny, method):
    """On CPU a factory without device= works by luck; on a GPU it would put the tensor on the CPU."""
    watch = FactoryWatch()
    with watch:
        run_all_stages(*tiny, DecodeSettings(method=method, width=4, budget=12, candidates=8, max_new_tokens=8))
    assert not watch.undevised, watch.undevised


def tensors_of(record):
    return {k: v for k, v in vars(record).items() if isinstance(v, torch.Tensor)}


EXPECTED = {
    DraftRecord: {"cand_tokens": torch.long, "marginal_lp": torch.float32},
    DepthRecord: {"frontier": torch.long, "parent": torch.long, "token": torch.long, "marginal_lp": torch.float32,
                  "corrected_lp": torch.float32, "score": torch.float32, "rank": torch.long, "survived": torch.bool,
                  "node_index": torch.long},
    TreeRecord: {"tokens": torch.long, "parents": torch.long, "depths": torch.long, "scores": torch.float32},
    VerifyRecord: {"tokens": torch.long, "parents": torch.long, "depths": torch.long, "visible": torch.bool,
                   "target_tokens": torch.long, "accepted": torch.bool, "path": torch.long},
}


def bf16_models():
    t = tiny_target()
    t.model.to(torch.bfloat16)
    t = Target(model=t.model, tokenizer=None, name="tiny-bf16", device=t.device, dtype=torch.bfloat16,
               eos_token_ids=t.eos_token_ids)
    return t, tiny_drafter(t).to(torch.bfloat16)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["ddtree", "dartree"])
def test_records_live_on_the_target_device_with_their_dtypes(tiny, precision, method):
    """bf16 is what a GPU runs by default: the same code must keep fp32 scores and exact token ids."""
    target, drafter = tiny if precision == "fp32" else bf16_models()
    dec, records = run_all_stages(target, drafter, DecodeSettings(method=method, width=4, budget=12, candidates=8,
                                                                  max_new_tokens=10))
    assert dec.generator.device.type == target.device.type
    seen = set()
    for rec in records:
        for name, tensor in tensors_of(rec).items():
            assert tensor.device == target.device, (type(rec).__name__, name)
            want = EXPECTED.get(type(rec), {}).get(name)
            if want is not None:
                assert tensor.dtype == want, (type(rec).__name__, name, tensor.dtype)
                seen.add(type(rec))
        rec.to_dict()  # every record turns into host data
    assert {DraftRecord, TreeRecord, VerifyRecord} <= seen
    for layer in dec.cache.layers:
        assert layer.keys.device == target.device and layer.keys.dtype == target.dtype
    result = dec.result()
    assert 1 <= result.new_tokens <= 10
    reference = generate(target, None, PROMPT, DecodeSettings(method="ar", max_new_tokens=10))
    assert result.token_ids[0] == reference.token_ids[0]  # the prefill is the same computation
    if precision == "fp32":
        assert result.token_ids == reference.token_ids


# ---------------------------------------------------------------------------------------------- host syncs
class SyncCounter(TorchDispatchMode):
    """Counts the operations that make a GPU wait for the host, per label, with where they come from."""

    DATA_DEPENDENT = {"aten.item.default", "aten._local_scalar_dense.default", "aten.is_nonzero.default",
                      "aten.nonzero.default", "aten.masked_select.default", "aten.equal.default",
                      "aten.allclose.default", "aten.bincount.default", "aten.unique_consecutive.default",
                      "aten._unique2.default", "aten.unique_dim.default"}

    def __init__(self):
        super().__init__()
        self.label = "setup"
        self.events = Counter()
        self.where = Counter()

    def hit(self, kind: str):
        self.events[self.label] += 1
        self.where[(self.label, kind, caller_in_package() or "outside dartree")] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name in self.DATA_DEPENDENT:
            self.hit(name)
        elif name.startswith(("aten.index.", "aten.index_put")) and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
                if i is not None):
            self.hit(name + " (boolean mask)")
        elif name == "aten.repeat_interleave.Tensor" and kwargs.get("output_size") is None:
            self.hit(name + " (no output_size)")
        elif name.startswith(("aten.to.", "aten._to_copy")) and str(kwargs.get("device", "")) == "cpu":
            self.hit(name + " (to cpu)")
        return func(*args, **kwargs)


class H2DWatch(TorchFunctionMode):
    """torch.tensor / as_tensor from host data: a blocking host-to-device copy on a GPU."""

    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("tensor", "as_tensor") and not (args and isinstance(args[0], torch.Tensor)):
            if caller_in_package() is not None:
                self.counter.hit(f"torch.{func.__name__} from host data")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def sync_counter(monkeypatch):
    counter = SyncCounter()
    inside = []  # a torch-function mode hands the (patched) method back to itself: count the outer call only
    for method in ("tolist", "numpy"):  # .cpu() is seen by the dispatch mode as a copy to the CPU
        original = getattr(torch.Tensor, method)

        def wrapped(self, *a, _original=original, _method=method, **k):
            if not inside:
                counter.hit(f"Tensor.{_method}")
            inside.append(1)
            try:
                return _original(self, *a, **k)
            finally:
                inside.pop()

        monkeypatch.setattr(torch.Tensor, method, wrapped)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: counter.hit("torch.cuda.synchronize"))
    return counter


def count_round_syncs(models, settings, counter: SyncCounter, rounds: int = 3):
    """Sync counts per stage ('draft', 'depth', 'prune', 'verify', 'commit') for each of the first rounds."""
    dec = Decoder(*models, PROMPT, settings)
    dec.prefill()
    per_round = []
    with counter, H2DWatch(counter):
        for _ in range(rounds):
            if dec.next_stage == "done":
                break
            counter.events.clear()
            depth_steps = []
            while True:
                stage = dec.next_stage
                counter.label = stage
                before = counter.events[stage]
                dec.step()
                if stage == "depth":
                    depth_steps.append(counter.events[stage] - before)
                if stage == "commit":
                    break
            per_round.append((dict(counter.events), depth_steps))
    return per_round


GRID = [(1, 1), (4, 16), (16, 64), (64, 256)]


@pytest.mark.parametrize("method", ["dartree", "dartree-fixed", "chain"])
def test_depth_steps_never_sync_and_rounds_sync_a_constant_number_of_times(tiny, sync_counter, method, monkeypatch):
    # as on a GPU: no early stop (its one read per depth is free only on the CPU; the next test counts it)
    monkeypatch.setattr(tree_mod, "HOST_READ_FREE", ())
    seen = []
    for width, budget in GRID:
        settings = DecodeSettings(method=method, width=width, budget=budget, candidates=32, max_new_tokens=64)
        per_round = count_round_syncs(tiny, settings, sync_counter)
        assert per_round, "no round ran"
        for n, (events, depth_steps) in enumerate(per_round):
            assert depth_steps and all(k == 0 for k in depth_steps), (
                f"W={width} B={budget}: host syncs inside depth steps {depth_steps}: "
                f"{[k for k in sync_counter.where if k[0] == 'depth']}")
            assert events.get("prune", 0) == 0, [k for k in sync_counter.where if k[0] == "prune"]
            seen.append(((width, budget, n), {k: events.get(k, 0) for k in ("draft", "verify", "commit")}))
    first = seen[0][1]
    assert all(stages == first for _, stages in seen), seen  # the same in every round, whatever W and B
    # 7 on this code: draft 1 (int(anchor) for the record), verify 4 (nonzero for the path, indexing with the
    # 0-d `deepest`, int(bonus)), commit 2 (tolist of the path, int(bonus) again). Small, and fixed.
    assert sum(first.values()) <= 8, (first, dict(sync_counter.where))


def settle_line() -> str:
    """`file:line` of the builder's early-stop read (dartree.tree.DepthwiseBuilder._settle)."""
    lines = Path(tree_mod.__file__).read_text().splitlines()
    return f"tree.py:{next(i for i, line in enumerate(lines, 1) if 'the one host read, between depths' in line)}"


def test_on_the_cpu_a_depth_reads_at_most_the_early_stop_bool(tiny, sync_counter):
    """dartree's builder stops once its top-B cut is settled (dartree.tree.DepthwiseBuilder): on the CPU, one
    host read per depth step (free there), and nothing else."""
    stopped = 0
    for width, budget in GRID:
        settings = DecodeSettings(method="dartree", width=width, budget=budget, candidates=32, max_new_tokens=64)
        for events, depth_steps in count_round_syncs(tiny, settings, sync_counter):
            assert depth_steps and all(k <= 1 for k in depth_steps), depth_steps
            stopped += len(depth_steps) < tiny[1].max_depth
    assert {where for stage, _, where in sync_counter.where if stage == "depth"} <= {settle_line()}
    assert stopped > 0


def test_ddtree_syncs_a_constant_number_of_times_per_round(tiny, sync_counter):
    """DDTree's heap runs on the host by design (one copy of the [D, C] marginals per round)."""
    seen = set()
    for _, budget in GRID:
        settings = DecodeSettings(method="ddtree", budget=budget, candidates=32, max_new_tokens=64)
        for events, _ in count_round_syncs(tiny, settings, sync_counter):
            seen.add(tuple(sorted(events.items())))
    assert len(seen) == 1, seen
    assert sum(dict(seen.pop()).values()) <= 24


def test_depth_step_does_not_synchronize_the_gpu_for_timing(tiny, sync_counter):
    """`_now()` calls torch.cuda.synchronize when the device is CUDA; inside a depth step that stalls the
    GPU pipeline D times a round. Pretend the decoder's device is CUDA (only `_now` reads it there)."""
    dec = Decoder(*tiny, PROMPT, DecodeSettings(method="dartree", width=8, budget=32, max_new_tokens=16))
    dec.prefill()
    dec.draft()
    dec.device = torch.device("cuda")
    sync_counter.label = "depth"
    steps = 0
    while dec.next_stage == "depth":
        dec.expand()
        steps += 1
    assert steps >= 2
    hits = {k: v for k, v in sync_counter.where.items() if k[0] == "depth"}
    assert sync_counter.events["depth"] == 0, f"{sync_counter.events['depth']} syncs in {steps} depth steps: {hits}"


def test_the_counter_sees_syncs(sync_counter):
    """The instrumentation itself: each kind of host sync it claims to count is counted."""
    x = torch.arange(6)
    with sync_counter, H2DWatch(sync_counter):
        int(x[0])
        bool(x[1] > 0)
        x.nonzero()
        x[x > 2]
        x.tolist()
        x.repeat_interleave(torch.tensor([1, 1, 1, 1, 1, 1]))
        x.repeat_interleave(2)  # int repeats: no sync
        x.sort(stable=True)  # no sync
    assert sync_counter.events["setup"] == 6, dict(sync_counter.where)
