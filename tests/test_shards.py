"""The token-shard reader against the arrays a shard is written from."""

import numpy as np

from dartree.shards import folder_responses, read_tokens, response_lengths, sequences, tokens_path
from dartree.train.datagen import write_tokens
from dartree.train.stream import Generated


def _write(folder, k, seqs, sources=None):
    extra = {"source": np.asarray(sources)} if sources else None
    write_tokens(tokens_path(folder, k), [Generated(ids, p, None) for ids, p in seqs], list(range(len(seqs))), extra,
                 stats={"kind": "test"} if sources else None)


def test_sequences_slice_prompt_and_response_as_written(tmp_path):
    rng = np.random.default_rng(0)
    written = [(rng.integers(0, 65536, n).tolist(), p) for n, p in ((9, 4), (3, 3), (12, 1))]
    _write(tmp_path, 0, written, ["magpie", "real", "document"])
    shard = read_tokens(tokens_path(tmp_path, 0))
    got = list(sequences(shard))
    assert [s.source for s in got] == ["magpie", "real", "document"] and shard["stats"] == {"kind": "test"}
    for s, (ids, p) in zip(got, written):
        assert s.ids.dtype == np.int64 and s.ids.tolist() == ids and s.prompt_len == p
        assert s.response.tolist() == ids[p:]
    assert response_lengths(shard).tolist() == [5, 0, 11]


def test_a_shard_without_sources_reads_as_v1_and_folders_read_in_shard_order(tmp_path):
    _write(tmp_path, 1, [([5, 6, 7], 1)])
    _write(tmp_path, 0, [([1, 2, 3, 4], 2)])
    assert [s.source for s in sequences(read_tokens(tokens_path(tmp_path, 0)))] == ["v1"]
    assert [r.tolist() for r in folder_responses([tmp_path])] == [[3, 4], [6, 7]]
