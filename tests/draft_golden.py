"""What the draft-model golden writers (tests/mtp_golden.py, tests/eagle3_golden.py) share:
seeded random weights, RMSNorm, rotary embeddings, causal grouped-query attention, vLLM's
greedy proposer loop and the expected.json writer. Each writer keeps its own layer (the part
that differs); the arithmetic both layers use is written once here, so the two goldens cannot
drift apart in it.
"""

import json
import os

import torch


def randn(g):
    """A draw of seeded normal weights from generator `g`, scaled (0.2 unless told)."""

    def rnd(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    return rnd


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, head_dim, theta):
    """Rotate-half rotary embedding of `x` (rows, heads, head_dim) at positions `pos`."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    f = pos[:, None].float() * inv[None, :]
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    half = head_dim // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def causal_attention(q, k, v, pos, theta):
    """Causal grouped-query attention of q (rows, heads, d) over k, v (rows, kv_heads, d), with
    rotary embeddings at `pos`: the (rows, heads * d) output."""
    n, heads, head_dim = q.shape
    q, k = rope(q, pos, head_dim, theta), rope(k, pos, head_dim, theta)
    rep = heads // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / head_dim**0.5
    s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, heads * head_dim)


def propose(layer, tokens, hidden, k, to_target=lambda d: d):
    """vLLM's proposer, from scratch: row i reads token i + 1 and hidden row i, at position i;
    each draft feeds back the previous row's output. `layer(tokens, hidden, pos)` returns (the
    rows fed back, logits); `to_target` maps a draft id to the target's vocabulary."""
    toks = torch.tensor(tokens[1:])
    drafts = []
    for _ in range(k):
        fed, logits = layer(toks, hidden, torch.arange(toks.shape[0]))
        drafts.append(to_target(int(logits[-1].argmax())))
        toks = torch.cat([toks, torch.tensor([drafts[-1]])])
        hidden = torch.cat([hidden, fed[-1:]])
    return drafts


def write_expected(out, payload):
    """expected.json in `out`, and its cases printed."""
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(payload, f)
    print(payload["cases"])
