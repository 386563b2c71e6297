"""The qwen3moe model in PyTorch, and its training loop (used by train_tiny_moe.py `train`).

The math is llama.cpp's qwen3moe (strata/model/reference.py is the oracle): RMSNorm (eps 1e-6),
per-head q/k RMS norm, NEOX RoPE, grouped-query causal attention, a softmax router over all E
experts -> top-K -> renormalized weights, SwiGLU experts, untied output. Parameters carry the
GGUF numpy shapes, so export is a rename. Experts run grouped: assignments sorted by expert,
then one grouped GEMM per matrix (torch._grouped_mm) or, where that is missing, one GEMM per
expert over its contiguous rows.

Shape letters: B = windows, T = tokens per window, N = B*T, D, H, G, Dh, E, K, F, V.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the top-k weight sum below at this


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def rope_tables(t: int, dh: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, Dh/2] of NEOX RoPE (pairs i, i + Dh/2)."""
    inv = theta ** (-torch.arange(0, dh // 2, device=device, dtype=torch.float64) * 2.0 / dh)
    ang = torch.arange(t, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, Dh] rotated by position."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, dh, e, f = c.n_embd, c.head_dim, c.n_expert, c.expert_ff
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wq = nn.Parameter(torch.empty(c.n_head * dh, d))  # [H*Dh, D]
        self.wk = nn.Parameter(torch.empty(c.n_head_kv * dh, d))  # [G*Dh, D]
        self.wv = nn.Parameter(torch.empty(c.n_head_kv * dh, d))  # [G*Dh, D]
        self.wo = nn.Parameter(torch.empty(d, c.n_head * dh))  # [D, H*Dh]
        self.q_norm = nn.Parameter(torch.ones(dh))
        self.k_norm = nn.Parameter(torch.ones(dh))
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.router = nn.Parameter(torch.empty(e, d))  # [E, D]
        self.gate = nn.Parameter(torch.empty(e, f, d))  # [E, F, D]
        self.up = nn.Parameter(torch.empty(e, f, d))  # [E, F, D]
        self.down = nn.Parameter(torch.empty(e, d, f))  # [E, D, F]


class TinyMoE(nn.Module):
    def __init__(self, c, grouped: bool = True):
        super().__init__()
        self.c, self.grouped = c, grouped
        self.embd = nn.Parameter(torch.empty(c.n_vocab, c.n_embd))  # [V, D]
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.n_layer))
        self.out_norm = nn.Parameter(torch.ones(c.n_embd))
        self.output = nn.Parameter(torch.empty(c.n_vocab, c.n_embd))  # [V, D]

    def init_weights(self, gen: torch.Generator) -> None:
        c = self.c
        resid = 1.0 / math.sqrt(2 * c.n_layer)  # residual-branch outputs start small

        def normal(p, std):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)

        normal(self.embd, 1.0)
        normal(self.output, 1.0 / math.sqrt(c.n_embd))
        for ly in self.layers:
            for p in (ly.wq, ly.wk, ly.wv, ly.gate, ly.up):
                normal(p, 1.0 / math.sqrt(c.n_embd))
            normal(ly.router, 0.02)  # near-uniform routing at first: no early collapse
            normal(ly.wo, resid / math.sqrt(ly.wo.shape[1]))
            normal(ly.down, resid / math.sqrt(c.expert_ff))

    # ---- blocks ---------------------------------------------------------------------------

    def attention(self, ly: Layer, x, cos, sin):
        c = self.c
        b, t, _ = x.shape
        h = rms_norm(x, ly.attn_norm, c.rms_eps)  # [B, T, D]
        q = F.linear(h, ly.wq).view(b, t, c.n_head, c.head_dim)  # [B, T, H, Dh]
        k = F.linear(h, ly.wk).view(b, t, c.n_head_kv, c.head_dim)  # [B, T, G, Dh]
        v = F.linear(h, ly.wv).view(b, t, c.n_head_kv, c.head_dim)  # [B, T, G, Dh]
        q = rope(rms_norm(q, ly.q_norm, c.rms_eps), cos, sin)
        k = rope(rms_norm(k, ly.k_norm, c.rms_eps), cos, sin)
        rep = c.n_head // c.n_head_kv  # query head h reads KV head h // rep, as ggml does
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)  # [B, T, H, Dh]
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # [B, H, T, Dh]
        o = F.linear(o.transpose(1, 2).reshape(b, t, -1), ly.wo)
        return x + F.dropout(o, self.c.dropout, self.training)

    def route(self, ly: Layer, h):
        """Router in float32: probabilities [N, E], top-K ids and renormalized weights [N, K]."""
        with torch.autocast(h.device.type, enabled=False):  # bf16 would flip near-ties
            logits = h.float() @ ly.router.float().T  # [N, E]
        p = logits.softmax(-1)
        w, ids = p.topk(self.c.n_expert_used, dim=-1)  # [N, K]
        w = w / w.sum(-1, keepdim=True).clamp_min(MIN_WEIGHT_SUM)
        return p, ids, w

    def experts(self, ly: Layer, h, ids, w):
        """Σ_k w_k · SwiGLU_{ids_k}(h) for h [N, D]; returns [N, D] and per-expert counts [E]."""
        c = self.c
        n, kk = ids.shape
        flat = ids.reshape(-1)  # [N*K]
        order = flat.argsort(stable=True)
        tok = order // kk  # token of each sorted assignment
        counts = torch.bincount(flat, minlength=c.n_expert)  # [E]
        dt = torch.bfloat16 if h.is_cuda else h.dtype
        xs = h[tok].to(dt)  # [N*K, D]
        gate, up, down = (m.to(dt) for m in (ly.gate, ly.up, ly.down))
        if self.grouped:
            offs = counts.cumsum(0).to(torch.int32)
            g = torch._grouped_mm(xs, gate.transpose(1, 2), offs=offs)  # [N*K, F]
            u = torch._grouped_mm(xs, up.transpose(1, 2), offs=offs)
            y = torch._grouped_mm(F.silu(g) * u, down.transpose(1, 2), offs=offs)  # [N*K, D]
        else:
            parts, start = [], 0
            for e, cnt in enumerate(counts.tolist()):
                xe = xs[start : start + cnt]
                parts.append(F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e]))
                start += cnt
            y = torch.cat(parts)
        y = y.float() * w.reshape(-1)[order, None]
        out = torch.zeros(n, c.n_embd, device=h.device, dtype=torch.float32)
        return out.index_add_(0, tok, y).to(h.dtype), counts

    def forward(self, tokens: torch.Tensor, stats: list | None = None):
        """Logits [B, T, V] and the load-balancing loss (mean over layers)."""
        c = self.c
        b, t = tokens.shape
        cos, sin = rope_tables(t, c.head_dim, c.rope_theta, tokens.device)
        x = self.embd[tokens]  # [B, T, D]
        aux = x.new_zeros((), dtype=torch.float32)
        for ly in self.layers:
            x = self.attention(ly, x, cos, sin)
            h = rms_norm(x, ly.ffn_norm, c.rms_eps).reshape(b * t, -1)  # [N, D]
            p, ids, w = self.route(ly, h)
            y, counts = self.experts(ly, h, ids, w)
            x = x + F.dropout(y.view(b, t, -1), c.dropout, self.training)
            frac = counts.float() / ids.numel()  # share of assignments per expert [E]
            aux = aux + c.n_expert * (frac * p.mean(0)).sum()  # switch loss: 1.0 when uniform
            if stats is not None:
                stats.append(ids.view(b, t, -1))
        x = rms_norm(x, self.out_norm, c.rms_eps)
        return F.linear(x, self.output), aux / c.n_layer

    # ---- export ---------------------------------------------------------------------------

    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """float32 arrays under their GGUF names (shapes already in GGUF numpy order)."""
        return {k: v.detach().float().cpu().numpy() for k, v in self.gguf_params().items()}

    def load_gguf_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        """The inverse of gguf_tensors: set every parameter from its GGUF-named array."""
        with torch.no_grad():
            for k, p in self.gguf_params().items():
                p.copy_(torch.from_numpy(np.asarray(tensors[k], np.float32)).view(p.shape))

    def gguf_params(self) -> dict[str, nn.Parameter]:
        from gguf.constants import MODEL_TENSOR as MT

        from strata.model.arch.common import name

        out = {
            name(MT.TOKEN_EMBD): self.embd,
            name(MT.OUTPUT_NORM): self.out_norm,
            name(MT.OUTPUT): self.output,
        }
        for i, ly in enumerate(self.layers):
            out.update(
                {
                    name(MT.ATTN_NORM, i): ly.attn_norm,
                    name(MT.ATTN_Q, i): ly.wq,
                    name(MT.ATTN_K, i): ly.wk,
                    name(MT.ATTN_V, i): ly.wv,
                    name(MT.ATTN_OUT, i): ly.wo,
                    name(MT.ATTN_Q_NORM, i): ly.q_norm,
                    name(MT.ATTN_K_NORM, i): ly.k_norm,
                    name(MT.FFN_NORM, i): ly.ffn_norm,
                    name(MT.FFN_GATE_INP, i): ly.router,
                    name(MT.FFN_GATE_EXP, i): ly.gate,
                    name(MT.FFN_UP_EXP, i): ly.up,
                    name(MT.FFN_DOWN_EXP, i): ly.down,
                }
            )
        return out


def write_packs(tensors: dict[str, np.ndarray], out: Path, n_layer: int, dtype: str) -> None:
    """weights-LL.npz per layer (layer 0 also holds the global tensors): matrices as Q8_0
    blocks (or f32 with dtype="f32"), norms and the router as f32, each with .type/.shape."""
    import gguf.quants
    from gguf.constants import GGMLQuantizationType as QT

    out.mkdir(parents=True, exist_ok=True)
    files: dict[int, dict[str, np.ndarray]] = {i: {} for i in range(n_layer)}
    for tname, a in tensors.items():
        layer = int(tname.split(".")[1]) if tname.startswith("blk.") else 0
        keep_f32 = a.ndim == 1 or "ffn_gate_inp" in tname or dtype == "f32"
        qt = QT.F32 if keep_f32 else QT.Q8_0
        data = a.astype(np.float32) if keep_f32 else gguf.quants.quantize(a, QT.Q8_0)
        files[layer][tname] = data
        files[layer][tname + ".type"] = np.array(int(qt))
        files[layer][tname + ".shape"] = np.array(a.shape, np.int64)
    for i, arrays in files.items():
        np.savez(out / f"weights-{i:02d}.npz", **arrays)


# ---- training --------------------------------------------------------------------------------


def split_spaces(ids: np.ndarray, build: Path, p: float, seed: int) -> np.ndarray:
    """BPE-dropout for one merge: a fraction `p` of the tokens " word" become " " + "word".

    The Qwen2 split leaves a prompt's trailing space as a lone " " token, which plain BPE text
    only ever puts before digits; without this, "def " continues with digits."""
    tokens = json.loads((build / "tokenizer.json").read_text())["tokens"]
    ids_of = {t: i for i, t in enumerate(tokens)}
    space = ids_of["Ġ"]  # byte-level " "
    rest = np.full(len(tokens), -1, np.int64)  # " word" -> "word"
    for i, t in enumerate(tokens):
        if t.startswith("Ġ") and len(t) > 1 and t[1:] in ids_of:
            rest[i] = ids_of[t[1:]]
    rng = np.random.default_rng([seed, 0x5B1])
    pick = (rest[ids] >= 0) & (rng.random(ids.size) < p)
    at = np.arange(ids.size) + np.cumsum(pick) - pick  # where each token lands
    out = np.empty(ids.size + int(pick.sum()), ids.dtype)
    out[at] = np.where(pick, space, ids)
    out[at[pick] + 1] = rest[ids[pick]]
    print(f"space split: {int(pick.sum()):,} of {ids.size:,} tokens split")
    return out


def _grouped_mm_works(device) -> bool:
    """torch._grouped_mm exists here and agrees with the per-expert loop, gradients included."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    from types import SimpleNamespace

    c = SimpleNamespace(n_embd=256, expert_ff=256, n_expert=8, n_expert_used=2)
    gen = torch.Generator().manual_seed(0)
    ly = Layer(SimpleNamespace(**vars(c), head_dim=64, n_head=1, n_head_kv=1)).to(device)
    for p in (ly.gate, ly.up, ly.down):
        with torch.no_grad():
            p.copy_((torch.randn(p.shape, generator=gen) / 16).to(device))
    h = torch.randn(300, 256, generator=gen).to(device)
    ids = torch.randint(0, 8, (300, 2), generator=gen).to(device)
    ids[:, 1] = (ids[:, 0] + 1) % 8
    w = torch.rand(300, 2, generator=gen).to(device)
    res = []
    for grouped in (True, False):
        m = TinyMoE.__new__(TinyMoE)
        nn.Module.__init__(m)
        m.c, m.grouped = c, grouped
        for p in ly.parameters():
            p.grad = None
        try:
            y, _ = m.experts(ly, h, ids, w)
            y.float().square().sum().backward()
        except Exception as e:  # noqa: BLE001 - any failure means: use the loop
            print(f"torch._grouped_mm unusable here ({type(e).__name__}: {e}); per-expert loop")
            return False
        res.append((y.float(), ly.gate.grad.clone()))
    ok = all(
        torch.allclose(a, b, rtol=3e-2, atol=3e-2 * b.abs().max().item())
        for a, b in zip(res[0], res[1], strict=True)
    )
    print(f"torch._grouped_mm {'agrees with' if ok else 'DIFFERS from'} the per-expert loop")
    return ok


def evaluate(model, val: torch.Tensor, t: int, batch: int, with_stats: bool = False):
    """Mean next-token loss over non-overlapping windows of the held-out split (+ expert loads)."""
    c = model.c
    n = (val.numel() - 1) // t
    x = val[: n * t].view(n, t)
    y = val[1 : n * t + 1].view(n, t)
    tot, cnt = 0.0, 0
    loads = torch.zeros(c.n_layer, c.n_expert, dtype=torch.int64, device=val.device)
    win_stats = []
    model.eval()
    with torch.no_grad(), _autocast(val.device):
        for s in range(0, n, batch):
            stats: list = [] if with_stats else None
            logits, _ = model(x[s : s + batch], stats)
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), y[s : s + batch].flatten(), reduction="sum"
            )
            tot += loss.item()
            cnt += y[s : s + batch].numel()
            if with_stats:
                for i, ids in enumerate(stats):  # ids [b, T, K]
                    loads[i] += torch.bincount(ids.flatten(), minlength=c.n_expert)
                    per_win = F.one_hot(ids.flatten(1), c.n_expert).sum(1)  # [b, E]
                    win_stats.append((i, per_win.cpu().numpy()))
    model.train()
    if not with_stats:
        return tot / cnt
    per_layer = [[] for _ in range(c.n_layer)]
    for i, pw in win_stats:
        per_layer[i].extend(load_stats(r) for r in pw)
    window = [
        {k: float(np.mean([s[k] for s in per_layer[i]])) for k in ("entropy", "top25_share")}
        for i in range(c.n_layer)
    ]
    return tot / cnt, [load_stats(r) for r in loads.cpu().numpy()], window


def load_stats(counts: np.ndarray) -> dict:
    """Normalized entropy of an expert-load histogram and the traffic share of its top 25%."""
    p = counts / counts.sum()
    nz = p[p > 0]
    ent = float(-(nz * np.log(nz)).sum() / np.log(len(p)))
    top = np.sort(counts)[::-1][: max(1, len(p) // 4)].sum() / counts.sum()
    return {"entropy": ent, "top25_share": float(top)}


def _autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def lr_at(step: int, c, decay_start: int, total: int) -> float:
    """Warmup, constant, then linear decay to min_lr_frac (WSD) from `decay_start` to `total`."""
    if step < c.warmup:
        return c.lr * (step + 1) / c.warmup
    if step < decay_start:
        return c.lr
    frac = (step - decay_start) / max(1, total - decay_start)
    return c.lr * (1.0 - (1.0 - c.min_lr_frac) * frac)


def train(c, build: Path, out: Path, device: str | None = None, pack_dtype: str = "q8_0") -> None:
    t_start = time.time()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(c.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"device {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    train_np = np.load(build / "train.npy").astype(np.int64)
    if c.space_split > 0:
        train_np = split_spaces(train_np, build, c.space_split, c.seed)
    train_ids = torch.from_numpy(train_np).to(dev)
    val_ids = torch.from_numpy(np.load(build / "val.npy").astype(np.int64)).to(dev)
    grouped = _grouped_mm_works(dev)
    model = TinyMoE(c, grouped=grouped)
    gen = torch.Generator().manual_seed(c.seed)
    model.init_weights(gen)
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    active = n_params - 3 * c.n_layer * (c.n_expert - c.n_expert_used) * c.expert_ff * c.n_embd
    print(f"params {n_params / 1e6:.2f} M ({active / 1e6:.2f} M active per token)")
    decay = [p for p in model.parameters() if p.ndim >= 2 and p is not model.embd]
    no_decay = [p for p in model.parameters() if p.ndim < 2 or p is model.embd]
    groups = [
        {"params": decay, "weight_decay": c.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=c.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    t, b = c.n_ctx_train, c.batch
    arange = torch.arange(t + 1, device=dev)
    decay_steps = max(1, c.steps // 5)
    decay_start, total = c.steps - decay_steps, c.steps
    log = {"config": {**vars(c)}, "grouped_mm": grouped, "n_params": n_params, "active": active}
    curve, evals = [], []
    best = (float("inf"), -1, None)
    train_t0 = time.time()
    step = 0
    while step < total:
        lr = lr_at(step, c, decay_start, total)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_ids.numel() - t - 1, (b,), generator=gen).to(dev)
        win = train_ids[starts[:, None] + arange]  # [B, T+1]
        ts = time.time()
        with _autocast(dev):
            logits, aux = model(win[:, :-1])
            ce = F.cross_entropy(logits.float().flatten(0, 1), win[:, 1:].flatten())
            loss = ce + c.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0 or step == 1:
            ce_v, aux_v = ce.item(), aux.item()  # syncs: the step time below is real
            if not math.isfinite(ce_v):
                print(f"step {step}: loss {ce_v}; stopping (the best checkpoint is kept)")
                break
            curve.append({"step": step, "loss": round(ce_v, 4), "aux": round(aux_v, 4), "lr": lr})
            elapsed = time.time() - train_t0
            print(f"step {step:5d}/{total} loss {ce_v:.4f} aux {aux_v:.3f} lr {lr:.2e} "
                  f"[{elapsed:.0f} s, {(time.time() - ts) * 1e3:.0f} ms/step]")  # fmt: skip
        if step == 40:  # the time guard: fit the run into max_seconds
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - train_t0) / step
            budget = c.max_seconds - (time.time() - t_start) - 30  # evals and packing
            fit = step + int(budget / per_step / 1.1)
            if fit < total:
                total, decay_start = fit, fit - max(1, fit // 5)
                print(f"time guard: {per_step * 1e3:.0f} ms/step -> {total} steps")
        if step % c.eval_every == 0 or step == total:
            vl = evaluate(model, val_ids, t, 2 * b)
            evals.append({"step": step, "val_loss": round(vl, 4)})
            print(f"  eval step {step}: val loss {vl:.4f} (ppl {math.exp(vl):.2f})")
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            elif step < decay_start:  # held-out loss rose: over-fitting; anneal from here
                decay_start = step
                total = min(total, step + decay_steps)
                print(f"  val loss rose: decaying the learning rate over steps {step}..{total}")
    train_s = time.time() - train_t0
    if best[2] is None:
        raise RuntimeError("no held-out evaluation finished: nothing to save")
    model.load_state_dict(best[2])
    vl, loads, window = evaluate(model, val_ids, t, 2 * b, with_stats=True)
    print(f"best step {best[1]}: val loss {vl:.4f} (ppl {math.exp(vl):.2f}); train {train_s:.0f} s")
    for i, (s, w) in enumerate(zip(loads, window, strict=True)):
        print(f"  layer {i}: load entropy {s['entropy']:.3f} top-25% share "
              f"{s['top25_share']:.3f} | per {t}-token window {w['entropy']:.3f} "
              f"{w['top25_share']:.3f}")  # fmt: skip
    log.update(
        steps_run=step, best_step=best[1], best_val_loss=vl, train_seconds=round(train_s, 1),
        curve=curve, evals=evals, val_loads=loads, val_window_loads=window,
        val_tokens=int(val_ids.numel()), train_tokens=int(train_ids.numel()),
        epochs=round(step * b * t / train_ids.numel(), 2),
    )  # fmt: skip
    write_packs(model.gguf_tensors(), out, c.n_layer, pack_dtype)
    (out / "train_log.json").write_text(json.dumps(log, indent=1))
    print(f"packs written to {out} [{time.time() - t_start:.0f} s in all]")
