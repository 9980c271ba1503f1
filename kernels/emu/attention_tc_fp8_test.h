// attention_tc_fp8_test.h — paged_attention_tc_fp8e4m3_d{64,128,256} / _fp8e5m2_*
// (kernels/paged_attention_fp8.cu) on the emulator, against their contract: bitwise the bf16
// paged_attention_tc over the decoded cache (bf16 of each byte's value times the layer's scale),
// over attention_tc_test.h's cases (decodes, prefill chunks over a prefix, GQA 1-20, head_dim 64,
// 128 and 256, several partitions, sliding windows) and a bad block id, for both formats with
// scales 1 and not 1; and, within the fp8 kernel, split jobs == chunk jobs and each token alone
// == in the batch. Included by emu_test.cpp after attention_tc_test.h and kv_fp8_test.h.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "../paged_attention_fp8.cu"

namespace pattcfp8test {

using Check = pattest::Check;

// The fp8 caches and scales the wrappers below launch with (pattest::run passes the bf16
// decoded cache, which these kernels do not read).
inline const void* g_k8 = nullptr;
inline const void* g_v8 = nullptr;
inline float g_ks = 1.0f, g_vs = 1.0f;

template <typename KV>
using Fp8Kernel = void (*)(const float*, const KV*, const KV*, const u32*, const u32*, const u32*, float*, float*, float*, u32*, int, int, int,
                           int, int, int, int, int, int, int, float, int, float, float);

// An fp8 kernel with paged_attention_tc's signature (pattest::PatKernel).
template <typename KV, Fp8Kernel<KV> F>
void wrap(const float* q, const bf16_t*, const bf16_t*, const u32* pos, const u32* tseq, const u32* tables, float* out, float* po, float* pm,
          u32* counters, int T, int n_split, int H, int kvh, int bs, int nb, int S, int mb, int parts, int tw, float scale, int window) {
    F(q, (const KV*)g_k8, (const KV*)g_v8, pos, tseq, tables, out, po, pm, counters, T, n_split, H, kvh, bs, nb, S, mb, parts, tw, scale, window, g_ks,
      g_vs);
}

inline pattest::Variant variant(bool e4m3) {
    pattest::Variant v = pattest::tc();
    if (e4m3) {
        v.name = "paged_attention_tc_fp8e4m3";
        v.d64 = wrap<fp8e4m3_t, paged_attention_tc_fp8e4m3_d64>;
        v.d128 = wrap<fp8e4m3_t, paged_attention_tc_fp8e4m3_d128>;
        v.d256 = wrap<fp8e4m3_t, paged_attention_tc_fp8e4m3_d256>;
    } else {
        v.name = "paged_attention_tc_fp8e5m2";
        v.d64 = wrap<fp8e5m2_t, paged_attention_tc_fp8e5m2_d64>;
        v.d128 = wrap<fp8e5m2_t, paged_attention_tc_fp8e5m2_d128>;
        v.d256 = wrap<fp8e5m2_t, paged_attention_tc_fp8e5m2_d256>;
    }
    return v;
}

// The case's K/V encoded to fp8 bytes (x / scale, the kernel's own encode, which kv_fp8_test.h
// checks against the host oracle), and d's bf16 caches replaced by the decoded cache:
// bf16(decode(byte) * scale), the decode done on the host from the format's fields.
inline void quantize(pattest::Data& d, const kvfp8test::Format& f, float ks, float vs, std::vector<uint8_t>& kb, std::vector<uint8_t>& vb) {
    kb.resize(d.k.size());
    vb.resize(d.v.size());
    for (size_t i = 0; i < d.k.size(); ++i) {
        kb[i] = kvfp8test::dev_encode(f, bf16_bits_to_f32(d.k[i].bits) / ks);
        vb[i] = kvfp8test::dev_encode(f, bf16_bits_to_f32(d.v[i].bits) / vs);
        d.k[i] = bf16_t{f32_to_bf16_bits((float)kvfp8test::host_decode(f, kb[i]) * ks)};
        d.v[i] = bf16_t{f32_to_bf16_bits((float)kvfp8test::host_decode(f, vb[i]) * vs)};
    }
    g_k8 = kb.data();
    g_v8 = vb.data();
    g_ks = ks;
    g_vs = vs;
}

inline void run_all(const Check& check) {
    struct Setting {
        const kvfp8test::Format* f;
        float ks, vs;
        bool every_case;  // all of attention_tc_test.h's cases, or one a head size
    };
    const Setting settings[] = {
        {&kvfp8test::E4M3, 1.0f, 1.0f, true},
        {&kvfp8test::E4M3, 0.037f, 2.5f, false},
        {&kvfp8test::E5M2, 1.0f, 1.0f, false},
        {&kvfp8test::E5M2, 0.0123f, 17.25f, true},
    };
    const std::vector<pattest::Case> all = pattest::cases();
    for (const Setting& st : settings) {
        const pattest::Variant fp8 = variant(st.f->e4m3), tc = pattest::tc();
        const std::string vn = std::string(fp8.name) + " scales " + std::to_string(st.ks) + "/" + std::to_string(st.vs) + " ";
        std::vector<pattest::Case> cs;
        if (st.every_case) cs = all;
        else cs = {all[0], all[1], all[4], all[10], all[18]};  // d64, d128, partitions, a window, d256
        // A bad block id in sequence 1: the fp8 kernel's NaN rows and clean rows are tc's.
        pattest::Case bad{16, 2, 4, 64, {{3, 1}, {10, 12}, {40, 1}}};
        bad.bad_block_seq = 1;
        cs.push_back(bad);
        for (const pattest::Case& c : cs) {
            pattest::Data d = pattest::build(c);
            std::vector<uint8_t> kb, vb;
            quantize(d, *st.f, st.ks, st.vs, kb, vb);
            const int lead = pattest::leading_decodes(d);
            const auto got = pattest::run(fp8, d, lead), want = pattest::run(tc, d, lead);
            const size_t n = got.size();
            check(vn + pattest::name(c) + ": bitwise paged_attention_tc over the decoded cache", pattest::same(got, want.data(), n));
            const auto all_split = pattest::run(fp8, d, d.T), all_chunk = pattest::run(fp8, d, 0);
            check(vn + pattest::name(c) + ": split jobs, chunk jobs and the host's mix bitwise equal",
                  pattest::same(got, all_split.data(), n) && pattest::same(got, all_chunk.data(), n));
            bool alone_ok = true;
            const size_t row = (size_t)d.H * c.D;
            for (int t = 0; t < d.T; t += (d.T > 12 ? 7 : 1)) {
                const auto one = pattest::run(fp8, d, 1, 0, t);
                alone_ok = alone_ok && pattest::same(one, got.data() + (size_t)t * row, row);
            }
            check(vn + pattest::name(c) + ": every token alone == in the batch (bitwise)", alone_ok);
        }
    }
    check("paged_attention_tc_fp8*: every launch left its arrival counters at 0", pattest::counters_ok);
}

}  // namespace pattcfp8test
