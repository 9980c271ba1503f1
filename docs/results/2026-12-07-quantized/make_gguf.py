# Writes SmolLM2-135M-Instruct as a llama-arch GGUF with gguf-py (llama.cpp's Python package):
# matrices in the given type (Q8_0 or Q4_0, gguf.quants), norms F32, Q/K rows in llama.cpp's
# rope order (as convert_hf_to_gguf.py permutes them), the tokenizer from tokenizer.json.
import json, sys
import numpy as np, torch, gguf
from safetensors.torch import load_file
from gguf import GGMLQuantizationType as T

src, out, qname = sys.argv[1], sys.argv[2], sys.argv[3]
qt = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0, "Q4_K_M": T.Q4_K}[qname]
cfg = json.load(open(f"{src}/config.json"))
tok = json.load(open(f"{src}/tokenizer.json"))
tcfg = json.load(open(f"{src}/tokenizer_config.json"))
sd = {k: v.to(torch.float32).numpy() for k, v in load_file(f"{src}/model.safetensors").items()}
nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

def permute(w, n):
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

w = gguf.GGUFWriter(out, "llama")
w.add_block_count(cfg["num_hidden_layers"])
w.add_context_length(cfg["max_position_embeddings"])
w.add_embedding_length(cfg["hidden_size"])
w.add_feed_forward_length(cfg["intermediate_size"])
w.add_head_count(nh)
w.add_head_count_kv(nkv)
w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
w.add_rope_freq_base(cfg["rope_theta"])
w.add_file_type({"Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15}[qname])
vocab = tok["model"]["vocab"]
added = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
n = cfg["vocab_size"]
tokens = [""] * n
for t, i in list(vocab.items()) + list(added.items()):
    if i < n:
        tokens[i] = t
types = [3 if t in added else 1 for t in tokens]
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("smollm")
w.add_token_list(tokens)
w.add_token_types(types)
merges = tok["model"]["merges"]
w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
w.add_bos_token_id(cfg["bos_token_id"])
w.add_eos_token_id(cfg["eos_token_id"])
if "chat_template" in tcfg:
    w.add_chat_template(tcfg["chat_template"])

# Q4_K_M: gguf-py has no K-quant quantizer, so these are plain ones (the ranges of each
# sub-block, not llama.cpp's search): the file's layout and bytes per weight are a Q4_K_M's,
# its accuracy a little below llama.cpp's. Blocks as ggml-common.h's block_q4_K / block_q6_K.
def f16(v):
    return v.astype(np.float16).astype(np.float32)

def over(v, d):
    return v / np.where(d > 0, d, 1)

def q4_k(a):
    x = a.reshape(-1, 8, 32)
    lo, hi = np.minimum(x.min(-1), 0), np.maximum(x.max(-1), 0)
    scale, mn = (hi - lo) / 15, -lo
    d, dmin = f16(scale.max(-1) / 63), f16(mn.max(-1) / 63)
    sc = np.clip(np.rint(over(scale, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(over(mn, dmin[:, None])), 0, 63).astype(np.uint8)
    d1, m1 = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(over(x + m1[..., None], d1[..., None])), 0, 15).astype(np.uint8)
    sb = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, m[:, :4] | (m[:, 4:] >> 4) << 6,
                         (sc[:, 4:] & 15) | (m[:, 4:] & 15) << 4], axis=1)
    qs = (q[:, 0::2] | q[:, 1::2] << 4).reshape(-1, 128)
    dd = np.stack([d, dmin], 1).astype(np.float16).view(np.uint8)
    return np.concatenate([dd, sb, qs], axis=1).reshape(a.shape[0], -1)

def q6_k(a):
    x = a.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d = f16(scale.max(-1) / 127)
    sc = np.clip(np.rint(over(scale, d[:, None])), -128, 127).astype(np.int8)
    dl = d[:, None] * sc
    q = (np.clip(np.rint(over(x, dl[..., None])), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 15) | (q[:, :, 2] & 15) << 4, (q[:, :, 1] & 15) | (q[:, :, 3] & 15) << 4], 2)
    qh = (q[:, :, 0] >> 4) | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    dd = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), dd], 1).reshape(a.shape[0], -1)

# llama.cpp's Q4_K_M mix (llama_tensor_get_type): Q4_K, with Q6_K for the output (here the tied
# token_embd) and for attn_v / ffn_down in the layers use_more_bits picks; a matrix whose rows
# are not whole 256-value super-blocks falls back to Q5_0 (for Q4_K) or Q8_0 (for Q6_K).
def q4_k_m_type(name, cols, layer, n):
    t = T.Q4_K
    if name == "token_embd.weight":
        t = T.Q6_K
    elif name.endswith(("attn_v.weight", "ffn_down.weight")):
        more = layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2
        t = T.Q6_K if more else T.Q4_K
    if cols % 256:
        t = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}[t]
    return t

def mat(name, a, layer=0):
    t = qt
    if qname == "Q4_K_M":
        t = q4_k_m_type(name, a.shape[1], layer, cfg["num_hidden_layers"])
    a = a.astype(np.float32)
    q = {T.Q4_K: q4_k, T.Q6_K: q6_k}.get(t, lambda a: gguf.quants.quantize(a, t))(a)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)

mat("token_embd.weight", sd["model.embed_tokens.weight"])
w.add_tensor("output_norm.weight", sd["model.norm.weight"].astype(np.float32))
for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    b = f"blk.{i}."
    w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"].astype(np.float32))
    w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"].astype(np.float32))
    mat(b + "attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], nh), i)
    mat(b + "attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], nkv), i)
    mat(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"], i)
    mat(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"], i)
    mat(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], i)
    mat(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"], i)
    mat(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"], i)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
