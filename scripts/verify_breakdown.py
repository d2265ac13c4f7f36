"""Where a 9-node verify spends its time on the real target (interleaved medians): an AR step, 9 causal tokens
with and without feature layers, with the tree mask, the whole verify + walk, and model.model alone.

PYTHONPATH=. .venv/bin/python scripts/verify_breakdown.py
"""
import time, statistics, torch
from transformers import DynamicCache
from dartree.cache import truncate_cache
from dartree.draft import DrafterContext, PathCorrector, draft_block
from dartree.engine import DecodeSettings, build_round_tree, generate
from dartree.models.loading import load_models
from dartree.verify import verify_tree, walk_tree
from dartree.attention import additive_mask, ancestor_matrix, position_ids
torch.set_grad_enabled(False)
m=load_models("smollm2-135m","default"); t,d=m.target,m.drafter
prompt="Write a Python function that checks whether a number is prime, and explain how it works step by step."
ids=t.chat_ids(prompt)
ids=generate(t,None,ids,DecodeSettings(method='ar',max_new_tokens=100)).prompt_ids+generate(t,None,ids,DecodeSettings(method='ar',max_new_tokens=100)).token_ids
L=len(ids); print('prefix',L)
cache=DynamicCache(); layers=tuple(d.cfg.target_layer_ids)
out=t.forward(torch.tensor([ids[:-1]]),torch.arange(L-1)[None],cache,feature_layers=layers,logit_rows=slice(-1,None))
ctx=DrafterContext.from_prefill(d,out.features)
anchor=torch.tensor(ids[-1]); P=L-1
block=draft_block(d,t,ctx,anchor,P,7,64)
s=DecodeSettings(method='dartree',width=8,budget=8,depth=7,candidates=64)
_,tree,_=build_round_tree(s,block,PathCorrector(d,t,block))
N=tree.tokens.shape[0]; print('tree nodes',N)
toks=tree.tokens[None]; pos=position_ids(tree.depths,P); vis=ancestor_matrix(tree.parents,tree.max_depth); mask=additive_mask(vis,P,t.dtype)
causal_pos=torch.arange(P,P+N)[None]
cases={
 'AR step (1 token)': lambda: t.forward(toks[:, :1], causal_pos[:, :1], cache),
 '9 tokens causal, no features': lambda: t.forward(toks, causal_pos, cache),
 '9 tokens causal + features': lambda: t.forward(toks, causal_pos, cache, feature_layers=layers),
 '9 tokens tree mask + features': lambda: t.forward(toks, pos, cache, attention_mask=mask, feature_layers=layers),
 'verify_tree + walk': lambda: int(walk_tree(tree, verify_tree(t, tree, cache, P, layers)).bonus),
 'model.model only, tree mask': lambda: t.model.model(input_ids=toks, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True),
 'model.model only, causal': lambda: t.model.model(input_ids=toks, position_ids=causal_pos, past_key_values=cache, use_cache=True),
}
times={k:[] for k in cases}
for i in range(25):
    for k,f in cases.items():
        t0=time.perf_counter(); f(); times[k].append(time.perf_counter()-t0); truncate_cache(cache,P)
for k,v in times.items(): print(f'{k:35s} {1e3*statistics.median(v[3:]):7.1f} ms')
with torch.profiler.profile() as prof:
    for i in range(5):
        cases['9 tokens tree mask + features'](); truncate_cache(cache,P)
print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=18))
