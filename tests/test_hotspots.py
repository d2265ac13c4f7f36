"""CPU hot-path rewrites keep the numbers: the transposed LM-head GEMM against F.linear, on SmolLM2."""

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

pytestmark = pytest.mark.real


@torch.inference_mode()
def test_transposed_lm_head_matches_f_linear_row_by_row(real_target):
    t = real_target
    before, t.transposed_head = t.transposed_head, True
    ids = t.chat_ids("Name three rivers in Europe and one fact about each.")
    out = t.model.model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache(), use_cache=True)
    hidden = out.last_hidden_state[0, -40:]
    head = t.model.get_output_embeddings()
    for n in (1, 2, 7, 33, 40):
        got = t.lm_head(hidden[:n])
        want = F.linear(hidden[:n], head.weight).float()
        torch.testing.assert_close(got, want, rtol=0, atol=2e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        # each row's logits depend on that row only: the same row alone or inside a block agrees
        alone = t.lm_head(hidden[n - 1:n])
        torch.testing.assert_close(got[-1:], alone, rtol=0, atol=2e-4)
    t.transposed_head = before
