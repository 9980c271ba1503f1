#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs (fuzz/corpus/<target>/seed-*): small well-formed
files and requests, from which libFuzzer's mutations reach the parsers' deeper paths.
Run by `cargo xtask fuzz`; the files are committed too, so a run without Python has them."""
import json
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- GGUF v3: a one-layer Llama (hidden 32, 2 heads of 16, 1 KV head, ffn 32, vocab 16) ---
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gval(v):
    if isinstance(v, bool):
        return struct.pack("<I", 7) + struct.pack("<?", v)
    if isinstance(v, int):
        return struct.pack("<I", 4) + struct.pack("<I", v)
    if isinstance(v, float):
        return struct.pack("<I", 6) + struct.pack("<f", v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + gstr(v)
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            return struct.pack("<II", 9, 8) + struct.pack("<Q", len(v)) + b"".join(gstr(x) for x in v)
        return struct.pack("<II", 9, 5) + struct.pack("<Q", len(v)) + b"".join(struct.pack("<i", x) for x in v)
    raise TypeError(v)


def gguf(ttype, with_output):
    toks = ["<s>", "</s>", "a", "b", "c", "d", "e", "Ġ", "Ġa", "ab", "cd", "abc", "Ġb", "!", "?", "."]
    meta = [
        ("general.architecture", "llama"),
        ("general.alignment", 32),
        ("llama.block_count", 1),
        ("llama.context_length", 64),
        ("llama.embedding_length", 32),
        ("llama.feed_forward_length", 32),
        ("llama.attention.head_count", 2),
        ("llama.attention.head_count_kv", 1),
        ("llama.attention.layer_norm_rms_epsilon", 1e-5),
        ("llama.rope.freq_base", 10000.0),
        ("tokenizer.ggml.model", "gpt2"),
        ("tokenizer.ggml.pre", "default"),
        ("tokenizer.ggml.tokens", toks),
        ("tokenizer.ggml.token_type", [3, 3] + [1] * 14),
        ("tokenizer.ggml.merges", ["a b", "c d", "ab c", "Ġ a", "Ġ b"]),
        ("tokenizer.ggml.bos_token_id", 0),
        ("tokenizer.ggml.eos_token_id", 1),
        ("tokenizer.chat_template", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"),
    ]
    shapes = [("token_embd.weight", [32, 16]), ("output_norm.weight", [32])]
    if with_output:
        shapes.append(("output.weight", [32, 16]))
    for part, s in [("attn_norm", [32]), ("attn_q", [32, 32]), ("attn_k", [32, 16]), ("attn_v", [32, 16]), ("attn_output", [32, 32]),
                    ("ffn_norm", [32]), ("ffn_gate", [32, 32]), ("ffn_up", [32, 32]), ("ffn_down", [32, 32])]:
        shapes.append((f"blk.0.{part}.weight", s))

    def nbytes(t, n):
        return {0: 4 * n, 1: 2 * n, 30: 2 * n, 8: n // 32 * 34, 3: n // 32 * 20}[t]

    infos, data = b"", b""
    for name, dims in shapes:
        n = 1
        for d in dims:
            n *= d
        t = 0 if len(dims) == 1 else ttype
        while len(data) % 32:
            data += b"\0"
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, len(data))
        data += bytes((i * 37 + 11) % 251 for i in range(nbytes(t, n))) if t not in (0,) else struct.pack(f"<{n}f", *[((i * 7) % 13 - 6) / 50 for i in range(n)])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(meta)) + b"".join(gstr(k) + gval(v) for k, v in meta) + infos
    while len(head) % 32:
        head += b"\0"
    return head + data


# --- GGUF v3: a one-layer Gemma 3 (as llama.cpp's exporter writes it: norms stored as 1 + w, the
# sandwich and q/k norms, a SentencePiece vocabulary without merges) ---
def gguf_gemma3():
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<0x0A>", "\u2581", "a", "b", "ab", "\u2581a", "  ", "c", "d", "cd", "<start_of_turn>", "<end_of_turn>"]
    meta = [
        ("general.architecture", "gemma3"),
        ("general.alignment", 32),
        ("gemma3.block_count", 1),
        ("gemma3.context_length", 64),
        ("gemma3.embedding_length", 32),
        ("gemma3.feed_forward_length", 32),
        ("gemma3.attention.head_count", 2),
        ("gemma3.attention.head_count_kv", 1),
        ("gemma3.attention.key_length", 16),
        ("gemma3.attention.value_length", 16),
        ("gemma3.attention.layer_norm_rms_epsilon", 1e-6),
        ("gemma3.attention.sliding_window", 8),
        ("gemma3.rope.freq_base", 1000000.0),
        ("gemma3.rope.scaling.type", "linear"),
        ("gemma3.rope.scaling.factor", 8.0),
        ("tokenizer.ggml.model", "llama"),
        ("tokenizer.ggml.pre", "default"),
        ("tokenizer.ggml.tokens", toks),
        ("tokenizer.ggml.token_type", [3, 3, 3, 2, 6] + [1] * 9 + [3, 3]),
        ("tokenizer.ggml.bos_token_id", 2),
        ("tokenizer.ggml.eos_token_id", 1),
        ("tokenizer.ggml.add_bos_token", True),
        ("tokenizer.chat_template", "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"),
    ]
    shapes = [("token_embd.weight", [32, 16]), ("output_norm.weight", [32])]
    for part, s in [("attn_norm", [32]), ("attn_q", [32, 32]), ("attn_k", [32, 16]), ("attn_v", [32, 16]), ("attn_output", [32, 32]),
                    ("attn_q_norm", [16]), ("attn_k_norm", [16]), ("post_attention_norm", [32]), ("ffn_norm", [32]), ("post_ffw_norm", [32]),
                    ("ffn_gate", [32, 32]), ("ffn_up", [32, 32]), ("ffn_down", [32, 32])]:
        shapes.append((f"blk.0.{part}.weight", s))
    infos, data = b"", b""
    for name, dims in shapes:
        n = 1
        for d in dims:
            n *= d
        shift = 1.0 if name.endswith("norm.weight") else 0.0
        while len(data) % 32:
            data += b"\0"
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 0, len(data))
        data += struct.pack(f"<{n}f", *[shift + ((i * 7) % 13 - 6) / 50 for i in range(n)])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(meta)) + b"".join(gstr(k) + gval(v) for k, v in meta) + infos
    while len(head) % 32:
        head += b"\0"
    return head + data


# --- safetensors ---
def safetensors(entries):
    header, data = {}, b""
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def main():
    for t, name in [(0, "f32"), (1, "f16"), (8, "q8_0"), (3, "q4_1"), (30, "bf16")]:
        put("gguf", name, gguf(t, t != 0))
    put("gguf", "gemma3", gguf_gemma3())
    put("safetensors", "two", safetensors([("a", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f" * 3)]))
    put("safetensors", "f16", safetensors([("model.embed_tokens.weight", "F16", [4, 2], b"\x00\x3c" * 8)]))
    put("safetensors", "meta", safetensors([("x", "F32", [1], struct.pack("<f", 0.5))]).replace(b'{"x"', b'{"__metadata__":{"format":"pt"},"x"'))
    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "eos_token_id": [1, 2], "torch_dtype": "bfloat16",
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    put("config_json", "llama", json.dumps(llama))
    put("config_json", "qwen2", json.dumps({**llama, "architectures": ["Qwen2ForCausalLM"], "rope_scaling": None, "sliding_window": 4096, "use_sliding_window": False}))
    put("config_json", "mistral", json.dumps({"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                               "num_attention_heads": 2, "vocab_size": 100, "head_dim": 16, "rope_scaling": {"type": "linear", "factor": 2.0}}))
    tok = {"version": "1.0", "added_tokens": [{"id": 0, "content": "<s>", "special": True, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}],
           "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False, "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3, "Ġ": 4, "Ġa": 5, "c": 6},
                     "merges": ["a b", "Ġ a"]}}
    put("tokenizer_json", "bpe", b"\x00" + json.dumps(tok).encode())
    put("tokenizer_json", "wordlevel", b"\x00" + json.dumps({**tok, "pre_tokenizer": {"type": "Whitespace"}, "decoder": None,
                                                            "model": {"type": "WordLevel", "vocab": {"<s>": 0, "hi": 1, "there": 2, "<unk>": 3}, "unk_token": "<unk>"}}).encode())
    put("tokenizer_json", "config", b"\x01" + json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                                                         "chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content | upper }}{% endfor %}"}]}).encode())
    for i in range(6):
        put("chat_template", f"t{i}", bytes([i, 0x13 | (i << 1), 4] + [i, 0, 5] + list(b"hello") + [1, 9, 1] * 8 + [2, 0, 3] + list(b"abc") * 4))

    # [endpoint][server][script length][script][body]
    def req(endpoint, server, body, script=b"\x00\x03\x01\x00\x00\x00\x02\x00\x00\x00\x05\x00\x00\x00\x00\x00"):
        return bytes([endpoint, server, len(script)]) + script + json.dumps(body).encode()
    chat = {"model": "fuzz-model", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}], "max_tokens": 8}
    put("http_request", "chat", req(0, 0, chat))
    put("http_request", "chat-stream", req(0, 1, {**chat, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2, "n": 2}))
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    put("http_request", "chat-tools", req(0, 1, {**chat, "tools": [tool], "tool_choice": "auto", "stream": True}))
    put("http_request", "chat-forced", req(0, 2, {**chat, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
    put("http_request", "chat-schema", req(0, 0, {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}))
    put("http_request", "completion", req(1, 0, {"model": "fuzz-model", "prompt": ["hi", [1, 2, 3]], "max_tokens": 5, "echo": True, "logprobs": 2, "stop": ["\n"], "stream": True}))
    put("http_request", "completion-guided", req(1, 3, {"prompt": "x", "guided_regex": "[a-z]+", "prompt_logprobs": 1, "seed": 3}))
    put("http_request", "messages", req(2, 0, {"model": "fuzz-model", "max_tokens": 10, "system": "s", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": True}))
    put("http_request", "messages-tools", req(2, 4, {"model": "fuzz-model", "max_tokens": 10, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                                                     "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                                                                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}))
    put("http_request", "count", req(3, 0, {"model": "fuzz-model", "messages": [{"role": "user", "content": "count me"}]}))
    put("http_request", "tokenize", req(4, 0, {"model": "fuzz-model", "messages": chat["messages"], "add_generation_prompt": True}))
    put("http_request", "detokenize", req(5, 0, {"tokens": [1, 2, 3, 4]}))
    put("http_request", "generate", req(6, 0, {"prompt": "hi", "max_tokens": 3}))
    put("http_request", "responses", req(9, 0, {"model": "fuzz-model", "input": "hi", "instructions": "be brief", "max_output_tokens": 8, "stream": True}))
    put("http_request", "responses-tools", req(9, 1, {"model": "fuzz-model", "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                                                                               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                                                                               {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
                                                     "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}], "tool_choice": "auto",
                                                     "text": {"format": {"type": "json_object"}}, "store": True}))


if __name__ == "__main__":
    sys.exit(main())
