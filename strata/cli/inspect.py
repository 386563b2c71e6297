"""`strata inspect`: what a model is made of and what of it fits a VRAM budget."""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from strata.build import auto_slots
from strata.cli.common import load
from strata.model.loader import Model

MiB = 1 << 20


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"


def report(model: Model, budget_mib: int = 10240, n_ctx: int = 4096) -> str:
    a = model.args
    lines = [
        f"model      {model.path}",
        f"arch       {a.arch}   layers {a.n_layer}   hidden {a.n_embd}   vocab {a.n_vocab}",
        f"attention  heads {a.n_head}   kv heads {a.n_head_kv}   head dim {a.head_dim}   "
        f"rope theta {a.rope_theta:g}   ctx (train) {a.n_ctx_train}",
        f"experts    {a.n_expert} per layer, {a.n_expert_used} used per token, ffn {a.expert_ff}"
        + (f", shared expert ffn {a.shared_ff}" if a.shared_ff else ""),
    ]
    if a.linear_attn:
        n_rec = sum(a.is_recurrent(i) for i in range(a.n_layer))
        lines.append(
            f"deltanet   {n_rec} of {a.n_layer} layers (key heads {a.ssm_n_group}, value heads "
            f"{a.ssm_dt_rank}, head dim {a.ssm_d_state}, conv {a.ssm_d_conv}); rope dims "
            f"{a.rope_dims}; state {_mib(model.recurrent_bytes())} a sequence; "
            f"NextN layers {a.n_nextn}"
        )
    lines += [
        "",
        "tensor types:",
    ]
    by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for t in model.gguf.tensors.values():
        row = by_type[t.qtype.name]
        row[0] += 1
        row[1] += t.nbytes
        row[2] += int(np.prod(t.shape, dtype=np.int64))
    total = sum(r[1] for r in by_type.values())
    for name, (n, nbytes, elems) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
        bpw = 8 * nbytes / max(elems, 1)
        lines.append(f"  {name:8s} {n:5d} tensors  {_mib(nbytes):>14s}  {bpw:5.2f} bits/weight")
    lines.append(f"  {'total':8s} {len(model.gguf.tensors):5d} tensors  {_mib(total):>14s}")
    per_layer = [model.expert_bytes(i) for i in range(a.n_layer)]
    per_token = model.expert_bytes_per_token()
    experts_total = model.total_expert_bytes()
    dense = model.dense_bytes()
    lines += [
        "",
        f"expert bytes: one expert {per_layer[0]:,} B (layer 0); per layer (all {a.n_expert}) "
        f"{_mib(per_layer[0] * a.n_expert)}; all experts {_mib(experts_total)}",
        f"expert bytes per token: {per_token:,} B ({_mib(per_token)}) = "
        f"{a.n_expert_used} experts x {a.n_layer} layers",
        f"dense (non-expert) bytes: {_mib(dense)}",
    ]
    kv = model.kv_bytes(n_ctx)
    budget = budget_mib * MiB
    left = budget - dense - kv
    lines += [
        "",
        f"VRAM budget {budget_mib} MiB at ctx {n_ctx}: dense {_mib(dense)} + KV {_mib(kv)} "
        f"(f16; {_mib(model.kv_bytes(n_ctx, 'int8'))} with --kv-type int8)",
    ]
    if left <= 0:
        lines.append(f"  does not fit: dense + KV exceed the budget by {_mib(-left)}")
    else:
        mean_expert = experts_total / (a.n_expert * a.n_layer)
        slots = auto_slots(model, budget_mib, n_ctx)
        frac = slots / (a.n_expert * a.n_layer)
        lines.append(
            f"  expert cache: {_mib(left)} left -> {slots:,} of {a.n_expert * a.n_layer:,} experts "
            f"resident ({100 * frac:.1f}%); the rest ({_mib(experts_total - slots * mean_expert)}) "
            "run on the CPU pool"
        )
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    i = subparsers.add_parser(
        "inspect", help="architecture, tensor types and sizes, what fits a budget"
    )
    i.add_argument("model", nargs="?", default=None)
    i.add_argument("--budget-mib", type=int, default=10240, help="VRAM budget to plan for")
    i.add_argument("--ctx", type=int, default=4096, help="context length for the KV estimate")
    i.set_defaults(fn=cmd_inspect, model_opt=None)


def cmd_inspect(ns: argparse.Namespace) -> int:
    print(report(load(ns.model), budget_mib=ns.budget_mib, n_ctx=ns.ctx))
    return 0
