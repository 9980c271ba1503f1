"""A tiny random EAGLE-3 head (vLLM's checkpoint layout) and its greedy proposals, by a plain
PyTorch implementation of the head written from vLLM's llama_eagle3.py and eagle.py.

Writes tests/golden/eagle3-tiny/{config.json, model.safetensors, expected.json}. The head fits
the `tiny` random target (hidden 64, vocabulary 384, 2 layers: aux layers named [0, 1, 1]).
expected.json holds one sequence's committed tokens, the target's aux hidden states of every
position but the last (random here: the head only reads them), and for several prefix lengths
the head's k greedy drafts computed from scratch. Run once by hand, then commit the files:

    /tmp/hfvenv/bin/python tests/eagle3_golden.py
    tandem gen-model --shape tiny --seed 11 --dtype f32 --out /tmp/tiny11
    /tmp/hfvenv/bin/python tests/eagle3_golden.py --target /tmp/tiny11   # target_hidden.json
"""
import json
import os

import torch
from safetensors.torch import save_file

from draft_golden import causal_attention, propose, randn, rms as rms_eps, write_expected

OUT = os.path.join(os.path.dirname(__file__), "golden", "eagle3-tiny")
HIDDEN, VOCAB, DRAFT_VOCAB, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 384, 128, 4, 2, 16, 96
AUX = [0, 1, 1]
EPS, THETA = 1e-5, 10000.0

g = torch.Generator().manual_seed(40)
rnd = randn(g)


W = {
    "embed_tokens.weight": rnd(VOCAB, HIDDEN, scale=1.0),
    "fc.weight": rnd(HIDDEN, len(AUX) * HIDDEN, scale=0.1),
    "midlayer.input_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    "midlayer.hidden_norm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    "midlayer.self_attn.q_proj.weight": rnd(HEADS * HEAD_DIM, 2 * HIDDEN),
    "midlayer.self_attn.k_proj.weight": rnd(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
    "midlayer.self_attn.v_proj.weight": rnd(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
    "midlayer.self_attn.o_proj.weight": rnd(HIDDEN, HEADS * HEAD_DIM),
    "midlayer.post_attention_layernorm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    "midlayer.mlp.gate_proj.weight": rnd(INTER, HIDDEN),
    "midlayer.mlp.up_proj.weight": rnd(INTER, HIDDEN),
    "midlayer.mlp.down_proj.weight": rnd(HIDDEN, INTER),
    "norm.weight": 1.0 + rnd(HIDDEN, scale=0.1),
    "lm_head.weight": rnd(DRAFT_VOCAB, HIDDEN, scale=1.0),
}
hot = torch.sort(torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB]).values
W["d2t"] = (hot - torch.arange(DRAFT_VOCAB)).to(torch.int64)
t2d = torch.zeros(VOCAB, dtype=torch.bool)
t2d[hot] = True
W["t2d"] = t2d

CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": 1,
    "rms_norm_eps": EPS,
    "rope_theta": THETA,
    "max_position_embeddings": 2048,
    "vocab_size": VOCAB,
    "draft_vocab_size": DRAFT_VOCAB,
    "tie_word_embeddings": False,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX},
}


def rms(x, w):
    return rms_eps(x, w, EPS)


def head(tokens, hidden, pos):
    """The head over rows (token, hidden input) at positions `pos`, causal: (prenorm, logits)."""
    p = "midlayer."
    n = tokens.shape[0]
    e = rms(W["embed_tokens.weight"][tokens], W[p + "input_layernorm.weight"])
    x = torch.cat([e, rms(hidden, W[p + "hidden_norm.weight"])], -1)
    q = (x @ W[p + "self_attn.q_proj.weight"].T).view(n, HEADS, HEAD_DIM)
    k = (x @ W[p + "self_attn.k_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    v = (x @ W[p + "self_attn.v_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    a = causal_attention(q, k, v, pos, THETA)
    h = a @ W[p + "self_attn.o_proj.weight"].T + hidden
    x2 = rms(h, W[p + "post_attention_layernorm.weight"])
    m = (torch.nn.functional.silu(x2 @ W[p + "mlp.gate_proj.weight"].T) * (x2 @ W[p + "mlp.up_proj.weight"].T))
    pre = h + m @ W[p + "mlp.down_proj.weight"].T
    return pre, rms(pre, W["norm.weight"]) @ W["lm_head.weight"].T


def main():
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in W.items()}, os.path.join(OUT, "model.safetensors"))
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    n = 24
    tokens = torch.randint(0, VOCAB, (n,), generator=g).tolist()
    aux = torch.randn(n - 1, len(AUX) * HIDDEN, generator=g)
    to_target = lambda d: d + int(W["d2t"][d])
    fc = lambda m: aux[: m - 1] @ W["fc.weight"].T
    cases = [{"len": m, "k": 5, "drafts": propose(head, tokens[:m], fc(m), 5, to_target)} for m in (2, 6, 7, 12, 24)]
    write_expected(OUT, {"tokens": tokens, "aux": aux.flatten().tolist(), "cases": cases})


if __name__ == "__main__" and len(os.sys.argv) == 1:
    with torch.no_grad():
        main()


def target_hidden(model_dir):
    """The hidden states entering each layer of the `tiny` target (seed 11, f32: `tandem
    gen-model --shape tiny --seed 11 --dtype f32`) for one prompt, HF's output_hidden_states
    (entry l: the input to layer l), which the forward's aux states must equal."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = [119, 119, 119, 119, 3, 77, 200, 5, 9, 381, 12, 64]
    hs = m(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    out = {"tokens": tokens, "layers": [0, 1], "hidden": [hs[l][0].flatten().tolist() for l in (0, 1)]}
    with open(os.path.join(OUT, "target_hidden.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__" and len(os.sys.argv) > 2 and os.sys.argv[1] == "--target":
    with torch.no_grad():
        target_hidden(os.sys.argv[2])
