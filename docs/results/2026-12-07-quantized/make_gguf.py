# Writes SmolLM2-135M-Instruct as a llama-arch GGUF with gguf-py (llama.cpp's Python package):
# matrices in the given type (Q8_0 or Q4_0, gguf.quants), norms F32, Q/K rows in llama.cpp's
# rope order (as convert_hf_to_gguf.py permutes them), the tokenizer from tokenizer.json.
import json, sys
import numpy as np, torch, gguf
from safetensors.torch import load_file
from gguf import GGMLQuantizationType as T

src, out, qname = sys.argv[1], sys.argv[2], sys.argv[3]
qt = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0}[qname]
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
w.add_file_type({"Q8_0": 7, "Q4_0": 2}[qname])
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

def mat(name, a):
    q = gguf.quants.quantize(a.astype(np.float32), qt)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)

mat("token_embd.weight", sd["model.embed_tokens.weight"])
w.add_tensor("output_norm.weight", sd["model.norm.weight"].astype(np.float32))
for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    b = f"blk.{i}."
    w.add_tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"].astype(np.float32))
    w.add_tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"].astype(np.float32))
    mat(b + "attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], nh))
    mat(b + "attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], nkv))
    mat(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
    mat(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
    mat(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
    mat(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
    mat(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
