"""A tiny random MiMo model (a Qwen2 model saved by transformers, plus random MTP layer
weights under `model.mtp_layers.0.*` in vLLM's checkpoint layout) and the MTP layer's greedy
proposals, by a plain PyTorch implementation written from vLLM's mimo_mtp.py (the layer) and
eagle.py (the proposer).

Writes tests/golden/mtp-tiny/{config.json, model.safetensors, expected.json}. expected.json
holds one sequence's tokens, the target's hidden states of every position but the last (its
last layer's output before the final norm, from transformers' forward: what vLLM's MiMoModel
returns and its MTP layer reads), and for several prefix lengths the layer's k greedy drafts
computed from scratch. Run once by hand, then commit the files:

    /tmp/hfvenv/bin/python tests/mtp_golden.py
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from draft_golden import causal_attention, propose, randn, rms as rms_eps, write_expected

OUT = os.path.join(os.path.dirname(__file__), "golden", "mtp-tiny")
HIDDEN, VOCAB, HEADS, KV_HEADS, INTER, LAYERS = 64, 384, 4, 2, 160, 2
HEAD_DIM = HIDDEN // HEADS
EPS, THETA = 1e-6, 10000.0

torch.manual_seed(41)
g = torch.Generator().manual_seed(42)
rnd = randn(g)


P = "model.mtp_layers.0."
W = {
    P + "token_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    P + "hidden_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    P + "input_proj.weight": rnd(HIDDEN, 2 * HIDDEN, scale=0.15),
    P + "input_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    P + "self_attn.q_proj.weight": rnd(HEADS * HEAD_DIM, HIDDEN),
    P + "self_attn.q_proj.bias": rnd(HEADS * HEAD_DIM, scale=0.1),
    P + "self_attn.k_proj.weight": rnd(KV_HEADS * HEAD_DIM, HIDDEN),
    P + "self_attn.k_proj.bias": rnd(KV_HEADS * HEAD_DIM, scale=0.1),
    P + "self_attn.v_proj.weight": rnd(KV_HEADS * HEAD_DIM, HIDDEN),
    P + "self_attn.v_proj.bias": rnd(KV_HEADS * HEAD_DIM, scale=0.1),
    P + "self_attn.o_proj.weight": rnd(HIDDEN, HEADS * HEAD_DIM),
    P + "post_attention_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    P + "mlp.gate_proj.weight": rnd(INTER, HIDDEN),
    P + "mlp.up_proj.weight": rnd(INTER, HIDDEN),
    P + "mlp.down_proj.weight": rnd(HIDDEN, INTER),
    P + "final_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
}


def rms(x, w):
    return rms_eps(x, w, EPS)


def mtp(embed, lm_head, tokens, hidden, pos):
    """MiMoMultiTokenPredictorLayer over rows (token, previous hidden state) at positions
    `pos`, causal: (final_layernorm output, logits)."""
    n = tokens.shape[0]
    e = embed[tokens].clone()
    e[pos == 0] = 0
    x = torch.cat([rms(hidden, W[P + "hidden_layernorm.weight"]), rms(e, W[P + "token_layernorm.weight"])], -1)
    x = x @ W[P + "input_proj.weight"].T
    a_in = rms(x, W[P + "input_layernorm.weight"])
    lin = lambda t, name: t @ W[P + name + ".weight"].T + W[P + name + ".bias"]
    q = lin(a_in, "self_attn.q_proj").view(n, HEADS, HEAD_DIM)
    k = lin(a_in, "self_attn.k_proj").view(n, KV_HEADS, HEAD_DIM)
    v = lin(a_in, "self_attn.v_proj").view(n, KV_HEADS, HEAD_DIM)
    a = causal_attention(q, k, v, pos, THETA)
    h = x + a @ W[P + "self_attn.o_proj.weight"].T
    x2 = rms(h, W[P + "post_attention_layernorm.weight"])
    m = torch.nn.functional.silu(x2 @ W[P + "mlp.gate_proj.weight"].T) * (x2 @ W[P + "mlp.up_proj.weight"].T)
    h = h + m @ W[P + "mlp.down_proj.weight"].T
    out = rms(h, W[P + "final_layernorm.weight"])
    return out, out @ lm_head.T


def main():
    os.makedirs(OUT, exist_ok=True)
    cfg = Qwen2Config(
        hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=VOCAB, rms_norm_eps=EPS, rope_theta=THETA,
        max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        # transformers' init is small: larger weights give the target's greedy text some life.
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 2 and p.shape[0] == VOCAB else 0.15)
        for n, p in model.named_parameters():
            if "norm" in n:
                p.fill_(1.0).add_(torch.randn(p.shape) * 0.1)
    model.save_pretrained(OUT)
    st = load_file(os.path.join(OUT, "model.safetensors"))
    st.update({k: v.contiguous() for k, v in W.items()})
    save_file(st, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "config.json")) as f:
        c = json.load(f)
    c["architectures"] = ["MiMoForCausalLM"]
    c["model_type"] = "mimo"
    c["num_nextn_predict_layers"] = 1
    c.pop("auto_map", None)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    for extra in ("generation_config.json",):
        p = os.path.join(OUT, extra)
        if os.path.exists(p):
            os.remove(p)

    n = 24
    tokens = torch.randint(0, VOCAB, (n,), generator=g).tolist()
    kept = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda m, i, o: kept.__setitem__("h", o[0] if isinstance(o, tuple) else o)
    )
    model(torch.tensor([tokens]))
    hook.remove()
    hidden = kept["h"][0]
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    layer = lambda toks, h, pos: mtp(embed, lm_head, toks, h, pos)
    cases = [{"len": m, "k": 4, "drafts": propose(layer, tokens[:m], hidden[: m - 1], 4)} for m in (2, 6, 7, 12, 24)]
    write_expected(OUT, {"tokens": tokens, "hidden": hidden[: n - 1].flatten().tolist(), "cases": cases})


if __name__ == "__main__":
    with torch.no_grad():
        main()
