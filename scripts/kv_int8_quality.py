"""Held-out perplexity of the embedded model with the f16 and the int8 KV cache (host tier).

Run from the repo root: PYTHONPATH=. python scripts/kv_int8_quality.py
"""

import numpy as np

from strata.cpu.tier import HostTier
from strata.engine.engine import Engine
from strata.model.loader import load_model
from tests.test_kv_int8 import DEFAULT_MODEL, HELDOUT

model = load_model(DEFAULT_MODEL)
ids = model.tokenizer.encode(HELDOUT.read_text(), add_bos=True)[:384]


def ppl(kv):
    eng = Engine(model, tier=HostTier(model, n_ctx=384, kv_type=kv))
    lg = eng.forward(ids, all_logits=True)[:-1].astype(np.float64)
    lg -= lg.max(-1, keepdims=True)
    lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    return float(np.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean())), lg.argmax(-1)


p16, t16 = ppl("f16")
p8, t8 = ppl("int8")
agree = np.mean(t16 == t8)
print(
    f"tokens {len(ids)}  ppl f16 {p16:.4f}  int8 {p8:.4f}  ratio {p8 / p16:.4f}  top1 {agree:.4f}"
)
