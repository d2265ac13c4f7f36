"""One-off A/B behind docs/speed.md's draft-stage and tree-stage figures, interleaved in one process.

Compares the previous drafter (full 49k head) with the shipped one (16,384-token draft vocabulary) on the
draft pass, and the previous per-depth PathCorrector (cat + nn.GRU each depth) with the fused one on the
tree build. It needs the old files from git first:

    mkdir -p /tmp/olddrafter && for f in model.safetensors config.json; do
      git show dc7b2ee:assets/drafter-smollm2/$f > /tmp/olddrafter/$f; done
    git show 048780a:dartree/draft.py | sed 's/from .tree import/from dartree.tree import/' > /tmp/draft_old.py
    PYTHONPATH=. .venv/bin/python scripts/ab_stages.py
"""
import sys, time, statistics, torch
sys.path.insert(0,'/tmp'); import draft_old
from transformers import DynamicCache
from dartree.draft import DrafterContext, PathCorrector, draft_block
from dartree.engine import DecodeSettings, build_round_tree
from dartree.models.loading import load_models
torch.set_grad_enabled(False)
new=load_models("smollm2-135m","default"); old=load_models("smollm2-135m","/tmp/olddrafter")
t=new.target
ids=t.chat_ids("Write a Python function that checks whether a number is prime.")
cache=DynamicCache()
out=t.forward(torch.tensor([ids]),torch.arange(len(ids))[None],cache,feature_layers=tuple(new.drafter.cfg.target_layer_ids),logit_rows=slice(-1,None))
anchor=torch.tensor(ids[-1])
ctxs={}
for name,m in (('old',old),('new',new)):
    c=DrafterContext.from_prefill(m.drafter,out.features); ctxs[name]=(m.drafter,c)
times={'old':[],'new':[]}
for i in range(40):
    for name in ('old','new'):
        d,c=ctxs[name]; t0=time.perf_counter(); draft_block(d,t,c,anchor,len(ids),7,64); times[name].append(time.perf_counter()-t0)
print('draft pass ms  full head', round(1e3*statistics.median(times['old'][5:]),2), ' draft vocab', round(1e3*statistics.median(times['new'][5:]),2))
d,c=ctxs['new']; block=draft_block(d,t,c,anchor,len(ids),7,64)
for W,B in ((4,16),(8,32),(12,64)):
    s=DecodeSettings(method='dartree',width=W,budget=B,depth=7,candidates=64)
    a=build_round_tree(s,block,draft_old.PathCorrector(d,t,block)); b=build_round_tree(s,block,PathCorrector(d,t,block))
    same=torch.equal(a[1].tokens,b[1].tokens)
    ta,tb=[],[]
    for i in range(40):
        t0=time.perf_counter(); build_round_tree(s,block,draft_old.PathCorrector(d,t,block)); ta.append(time.perf_counter()-t0)
        t0=time.perf_counter(); build_round_tree(s,block,PathCorrector(d,t,block)); tb.append(time.perf_counter()-t0)
    print(f'tree build W={W} B={B} same tree {same}: per-depth cat+nn.GRU', round(1e3*statistics.median(ta[5:]),2),'ms, fused', round(1e3*statistics.median(tb[5:]),2),'ms')
