"""scripts/peer_llamacpp.py: its options, its message where llama-cpp-python is missing, its accounting."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "peer_llamacpp.py"


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("peer_llamacpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_names_the_bench_options():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for option in ("--prompt-file", "--limit", "--spread", "--max-new-tokens", "--out", "llama-cpp-python"):
        assert option in out.stdout


def test_without_llama_cpp_it_says_how_to_get_it_and_exits_2(peer, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # an import of it now fails, installed or not
    assert peer.main(["--limit", "2", "--out", str(tmp_path / "peer.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install llama-cpp-python" in err
    assert not (tmp_path / "peer.json").exists()


class FakeLlama:
    """Yields a fixed greedy continuation, as `Llama.generate` yields token ids; counts resets."""

    def __init__(self, continuation):
        self.continuation, self.resets = continuation, 0

    def reset(self):
        self.resets += 1

    def generate(self, tokens, **sampling):
        assert sampling["temp"] == 0.0 and sampling["top_k"] == 1 and sampling["reset"]
        yield from self.continuation


def test_a_prompt_stops_at_eos_or_the_token_limit_and_splits_prefill_from_decode(peer):
    llm = FakeLlama([5, 6, 2, 7, 8])
    stopped = peer.run_prompt(llm, [1, 1, 1], max_new_tokens=10, eos=(2,))
    assert stopped["token_ids"] == [5, 6, 2] and stopped["new_tokens"] == 3 and stopped["prompt_tokens"] == 3
    assert stopped["total_seconds"] == pytest.approx(stopped["prefill_seconds"] + stopped["decode_seconds"])
    assert peer.run_prompt(llm, [1], max_new_tokens=2, eos=(2,))["token_ids"] == [5, 6]
    assert llm.resets == 2  # every prompt from an empty cache


def test_summary_is_a_ratio_of_sums_as_the_bench(peer):
    rows = [{"new_tokens": 11, "prefill_seconds": 0.5, "decode_seconds": 1.0, "total_seconds": 1.5},
            {"new_tokens": 21, "prefill_seconds": 1.5, "decode_seconds": 1.0, "total_seconds": 2.5}]
    summary = peer.summarise(rows)
    assert summary["e2e_tokens_per_second"] == pytest.approx(32 / 4.0)
    assert summary["tokens_per_second"] == pytest.approx(30 / 2.0)
    assert summary["prefill_seconds_mean"] == pytest.approx(1.0)


@pytest.mark.real
def test_a_run_feeds_the_bench_token_ids_and_writes_json(peer, monkeypatch, tmp_path, real_target):
    """With a stand-in llama_cpp module: the prompts reach it as the bench's chat ids, the JSON is complete."""
    import json
    import types

    seen = []

    class Llama(FakeLlama):
        def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, verbose):
            super().__init__([7, 8, 9, 10])
            assert model_path.endswith(".gguf") and n_ctx > 5 and not verbose

        def generate(self, tokens, **sampling):
            seen.append(list(tokens))
            yield from super().generate(tokens, **sampling)

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=Llama, __version__="fake",
                                                                      llama_print_system_info=lambda: b"CPU : AVX2 = 1 | "))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name a colour.", "source": "a"}\n{"prompt": "Count to three.", "source": "b"}\n')
    out = tmp_path / "peer.json"
    assert peer.main(["--prompt-file", str(prompts), "--limit", "2", "--max-new-tokens", "3", "--out", str(out)]) == 0
    # after the warm-up, each prompt as the bench tokenises it
    assert seen[1:] == [real_target.chat_ids("Name a colour."), real_target.chat_ids("Count to three.")]
    result = json.loads(out.read_text())
    assert result["engine"] == "llama.cpp (llama-cpp-python fake)" and result["settings"]["n_prompts"] == 2
    assert result["machine"]["llama_cpp_system_info"] == "CPU : AVX2 = 1 |"  # which build was timed
    assert [r["token_ids"] for r in result["rows"]] == [[7, 8, 9]] * 2
    assert [r["source"] for r in result["rows"]] == ["a", "b"]
    assert result["e2e_tokens_per_second"] > 0 and result["tokens_per_second"] > 0
