// paged_attention_sm90.cu — prefill attention over the paged KV cache on wgmma, in the manner of
// FlashAttention-3 (sm_90a only): paged_attention_wgmma_d{64,128,256}.
//
// A VARIANT of kernels/paged_attention.cu's tensor-core attention (TANDEM_CUDA_ATTENTION=wgmma;
// off by default), in its own file because it exists only for sm_90a: NVRTC compiles this file
// for --gpu-architecture=sm_90a on an sm_90 device and to an empty module elsewhere (the body is
// under __CUDA_ARCH_FEAT_SM90_ALL), as kernels/matmul_sm90.cu is. It has the same arguments as
// paged_attention_tc_d* and keeps its CONTRACT (read it in paged_attention.cu, "paged_attention_tc"):
// per row the arithmetic is tc's operation for operation (steps 1-3: 64-key tiles at absolute
// positions, q and p rounded to bf16, s in ascending k16 steps of the head dims from 0, the
// online-softmax step in tc's order, o rescaled then += bf16(p) . V in four k16 steps of
// ascending keys, partitions of pat_part_len of the row's own span folded in order), so a
// token's bits are tc's whichever job serves it: decode == prefill chunk holds with the switch
// on. Only the k16 steps are wgmma m64nNk16 instead of mma.sync m16n8k16: the emulator
// (kernels/emu/wgmma.h) sums one k16 step of either in the same order, and the accumulator
// fragment of warp v of a warpgroup is, register for register, the fragment a tc warp holds for
// its 16 rows (register 4 n + i of wgmma = tc's [n][i]), so the softmax and fold code runs
// unchanged on it. kernels/emu/sm90_attention_test.cpp checks every output bitwise against
// paged_attention_tc. On the GPU that equality is UNPROVEN until a GPU check compares the two
// (gpu/tune.sh): the hardware's order inside one instruction is undocumented.
//
// Grid (crates/cuda/src/attention.rs `attention_tc`): chunk blocks only, for the tokens from
// n_split on; the split tokens (decodes, the first n_split) are tc's split jobs, launched right
// after by paged_attention_tc_d* with num_tokens = n_split (the same bits as tc's own launch:
// they are the same jobs). Kept out of this kernel because tc's split job needs more registers
// than 384 threads a block leave (ptxas spilled it here).
//   Chunk block (PAW_THREADS = 384 threads, 3 warpgroups): tokens of ONE sequence (one at a
//   time when the block's 8 tw tokens span two) and one KV-head group, as tc_shared's blocks but
//   twice as many rows:
//   - warpgroup 0, the producer: per 64-key tile it waits for a ring stage to be free
//     (mbarrier empty[s]), loads the tile's K (64 keys x D) and V (stored transposed, D x 64
//     keys) from the paged cache into the stage with plain 16-byte loads (warp w: keys 16 w ..
//     16 w + 15), fences them for the async proxy and arrives on full[s] (128 arrivals). TMA
//     cannot follow a block table: a tile's 64 keys lie in 64 / block_size blocks anywhere in
//     the cache (a 16-key block is 16 x KVH x D elements with this head's D among them), so a
//     TMA box would need one descriptor per page and head; per-page copies by threads serve
//     any block size. V is transposed on the way (16-bit stores) because wgmma reads B
//     K-major from shared memory and the emulator models only that (no transpose flag), and
//     P . V's K dimension is the keys. The loads are plain rather than cp.async so that the
//     producer can store V transposed; it has nothing else to do, so nothing is lost by waiting.
//   - warpgroups 1 and 2, the consumers: 64 rows each (warp v of consumer c holds the 16 rows
//     of tc's chunk job for tokens t0 + (4 c + v) tw ..), q staged once per job in shared memory
//     (bf16, zero for a row with no keys). Per tile: wait for full[s]; S = Q . K^T, one wgmma
//     m64n64k16 per k16 step of the head dims, committed and waited for; tc's mask, scale and
//     online-softmax step in registers; the warpgroup meets (named barrier 1 + c: every warp is
//     done with the previous tile's P) and writes bf16(p) into its 64 x 64 P tile, fences it,
//     meets again; O += P . V, four wgmma m64nDk16 (D = 64, 128, 256); waits; each warp's lane 0
//     arrives on empty[s] (8 arrivals free it); each row whose partition ends folds (tc's).
//   - not modelled, so not built: FA3's ping-pong of the two consumers (one warpgroup's softmax
//     under the other's GEMMs, ordered by named barriers) and the intra-warpgroup overlap of
//     the softmax with the next S = Q . K^T. The emulator runs each wgmma at its wait and has
//     no clock, so it can neither show their benefit nor tell a schedule that only changes
//     timing from one that changes bits; they change no bit (each row's operations and their
//     order stay as above), so they are the next step once a GPU can time them.
//   - also not checked by the emulator: fence.proxy.async (its memory has one proxy) and the
//     register split (setmaxnreg: the producer gives registers back at D 256 so that the
//     consumers' 128 o accumulators fit).
// Shared memory (PawCfg<D>::SMEM, opt-in): NS ring stages of K and V^T tiles (64 x D bf16 each),
// two Q tiles (64 x D bf16), two P tiles (64 x 64 bf16), NS x 4 u32 bad-key masks, 2 NS
// mbarriers, 128 bytes of alignment slack: NS = 4 at D 64 (98,560 bytes), 3 at D 128
// (147,680), 2 at D 256 (213,184). Operands in the no-swizzle K-major layout: core matrices of
// 8 rows x 16 bytes, 128 bytes each, K neighbours adjacent (LBO 128), 8-row groups K x 16 bytes
// apart (SBO); a k16 step starts 256 bytes on.
// Test hooks (kernels/emu/sm90_attention_test.cpp sets TANDEM_PAW_BREAK; each must be caught):
//   1 the consumers wait for full[s] with the wrong parity, 2 a consumer warp releases the stage
//   before its P . V wait, 3 the P tile's rows written without the warp's 16-row offset.
#include "common.cuh"
// paged_attention.cu's device code (PatArgs, pat_job, pat_chunk_fold, ...), not its kernels.
#define TANDEM_PAGED_ATTENTION_DEVICE_ONLY
#include "paged_attention.cu"

#ifndef TANDEM_PAW_BREAK
#define TANDEM_PAW_BREAK 0
#endif

#define PAW_CONSUMERS 2
#define PAW_THREADS (128 * (1 + PAW_CONSUMERS))
#define PAW_ROW_WARPS (4 * PAW_CONSUMERS)  // warps of rows in a chunk block, tw tokens each

#if defined(TANDEM_HOST_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int D>
struct PawCfg {
    static constexpr int NS = D == 64 ? 4 : D == 128 ? 3 : 2;
    static constexpr int TILE = PAT_TILE * D * 2;  // bytes of one K or V^T tile
    static constexpr int QT = 64 * D * 2, PT = 64 * PAT_TILE * 2;
    static constexpr int Q_AT = NS * 2 * TILE, P_AT = Q_AT + PAW_CONSUMERS * QT, BAD_AT = P_AT + PAW_CONSUMERS * PT;
    static constexpr int BAR_AT = BAD_AT + NS * 16;
    static constexpr int SMEM = 128 + BAR_AT + 2 * NS * 8;
};

// Byte offset of element (i, k) of a K-major operand whose K extent is kd (no swizzle).
__device__ __forceinline__ u32 paw_at(int i, int k, int kd) { return (u32)((i >> 3) * kd * 16 + (k >> 3) * 128 + (i & 7) * 16 + (k & 7) * 2); }
__device__ __forceinline__ u64 paw_desc(const unsigned char* p, int kd) { return wgmma_desc(smem_u32(p), 128, (u32)kd * 16, 0); }

// The keys of a job's tokens [t0, t1) of one sequence: from the first tile any of them sees
// (0 without a window) to the end of the longest good context; kb >= ke: none.
__device__ __forceinline__ void paw_keys(const PatArgs& a, int t0, int t1, int& kb, int& ke) {
    const bool seq_bad = a.token_seq[t0] >= (u32)a.num_seqs;
    kb = a.window > 0 ? 0x7fffffff : 0;
    ke = 0;
    for (int t = t0; t < t1; ++t) {
        const int cx = (int)min(a.positions[t], 0x7ffffffeu) + 1;
        if (seq_bad || cx > a.max_blocks * a.block_size) continue;
        ke = max(ke, cx);
        if (a.window > 0) kb = min(kb, pa_first_key(cx, a.window) / PAT_TILE * PAT_TILE);
    }
}

// O += P . V over one tile: four k16 steps of ascending keys, N = D.
template <int D>
__device__ __forceinline__ void paw_pv(float (&o)[D / 8][4], u64 dp, u64 dv) {
    float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
    wgmma_fence_regs(of);
    wgmma_fence();
#pragma unroll
    for (int sub = 0; sub < 4; ++sub) {
        if constexpr (D == 64) wgmma_m64n64k16(bf16_t{}, of, dp + 16 * sub, dv + 16 * sub);  // + 256 bytes (>> 4)
        else if constexpr (D == 128) wgmma_m64n128k16(bf16_t{}, of, dp + 16 * sub, dv + 16 * sub);
        else wgmma_m64n256k16(bf16_t{}, of, dp + 16 * sub, dv + 16 * sub);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(of);
}

// The producer's part of a job: every tile of [kb, ke) into the ring (it: the block's tile count).
template <int D>
__device__ __forceinline__ void paw_produce(const PatArgs& a, int t0, int kh, int kb, int ke, unsigned char* base, u64* full, u64* empty, int& it) {
    constexpr int NS = PawCfg<D>::NS, CH = D / 8;
    u32* bad_s = (u32*)(base + PawCfg<D>::BAD_AT);
    const int warp = (int)(threadIdx.x >> 5) & 3, lane = (int)threadIdx.x & 31;
    const u32 seq = a.token_seq[t0];
    const u32* table = a.block_tables + (size_t)(seq >= (u32)a.num_seqs ? 0 : seq) * a.max_blocks;
    const size_t slot_stride = (size_t)a.num_kv_heads * D, head_off = (size_t)kh * D;
    const int ntiles = (ke - kb + PAT_TILE - 1) / PAT_TILE;
    for (int tile = 0; tile < ntiles; ++tile, ++it) {
        const int s = it % NS;
        mbar_wait(&empty[s], ((it / NS) & 1) ^ 1);
        const int key0 = kb + tile * PAT_TILE + warp * PAT_SUB;
        int slot = -1;  // -1: past the job's keys (zeros); -2: a bad block id (zeros, NaN scores)
        if (lane < PAT_SUB) {
            const int pos = key0 + lane;
            if (pos < ke) {
                const u32 blk = table[pos / a.block_size];
                slot = blk < (u32)a.num_blocks ? (int)blk * a.block_size + pos % a.block_size : -2;
            }
        }
        const u32 badm = __ballot_sync(0xffffffffu, slot == -2);
        if (lane == 0) bad_s[s * 4 + warp] = badm;
        unsigned char* kt = base + s * 2 * PawCfg<D>::TILE;
        unsigned char* vt = kt + PawCfg<D>::TILE;
        for (int e = lane; e < PAT_SUB * CH; e += 32) {
            const int key = e / CH, ch = e % CH, row = warp * PAT_SUB + key;
            const int sl = __shfl_sync(0xffffffffu, slot, key);
            uint4 kv{0u, 0u, 0u, 0u}, vv{0u, 0u, 0u, 0u};
            if (sl >= 0) {
                const size_t off = (size_t)sl * slot_stride + head_off + ch * 8;
                kv = *reinterpret_cast<const uint4*>(a.k_cache + off);
                vv = *reinterpret_cast<const uint4*>(a.v_cache + off);
            }
            *reinterpret_cast<uint4*>(kt + paw_at(row, ch * 8, D)) = kv;
            const u32 w[4] = {vv.x, vv.y, vv.z, vv.w};
            for (int x = 0; x < 8; ++x)
                *reinterpret_cast<unsigned short*>(vt + paw_at(ch * 8 + x, row, PAT_TILE)) = (unsigned short)(w[x >> 1] >> (16 * (x & 1)));
        }
        fence_proxy_async();
        mbar_arrive(&full[s]);
    }
}

// A consumer warpgroup's part of a job: its 64 rows (tokens w0.. of warp 4 cg + v), tc's
// per-row arithmetic with the k16 steps on wgmma.
template <int D>
__device__ __forceinline__ void paw_consume(const PatArgs& a, int t0, int t1, int kh, int h0, int G, int kb, int ke, unsigned char* base, u64* full,
                                            u64* empty, int& it) {
    constexpr int NS = PawCfg<D>::NS, NT = D / 8, KS = D / 16;
    const int cg = (int)(threadIdx.x >> 7) - 1, v = (int)(threadIdx.x >> 5) & 3, lane = (int)threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int H = a.num_heads;
    const int w0 = t0 + (4 * cg + v) * a.tw, nt = max(0, min(a.tw, t1 - w0));
    const u32 seq = a.token_seq[t0];
    const bool seq_bad = seq >= (u32)a.num_seqs;
    int ctx[2], plen[2];
    bool bad[2];
    size_t orow[2];
    for (int rr = 0; rr < 2; ++rr) {
        const int r = g + 8 * rr;
        const bool live = r < nt * G;
        const int t = live ? w0 + r / G : t0, h = h0 + (live ? r % G : 0);
        orow[rr] = ((size_t)t * H + h) * D;
        const int cx = (int)min(a.positions[t], 0x7ffffffeu) + 1;
        plen[rr] = pat_part_len(cx - pa_first_key(cx, a.window) / PAT_TILE * PAT_TILE);
        bad[rr] = live && (seq_bad || cx > a.max_blocks * a.block_size);
        ctx[rr] = live && !bad[rr] ? cx : 0;
    }
    auto lo = [&](int rr) { return pa_first_key(ctx[rr], a.window); };
    auto base_of = [&](int rr) { return lo(rr) / PAT_TILE * PAT_TILE; };
    for (int rr = 0; rr < 2; ++rr)
        if (bad[rr])
            for (int n = 0; n < NT; ++n) {
                a.out[orow[rr] + n * 8 + 2 * c] = nan_f32();
                a.out[orow[rr] + n * 8 + 2 * c + 1] = nan_f32();
            }
    if (kb >= ke) return;  // block-uniform: none of the job's rows has a key

    unsigned char* qs = base + PawCfg<D>::Q_AT + cg * PawCfg<D>::QT;
    unsigned char* ps = base + PawCfg<D>::P_AT + cg * PawCfg<D>::PT;
    const u32* bad_s = (const u32*)(base + PawCfg<D>::BAD_AT);
    const u32 bar = 1 + (u32)cg;
    const int r0 = 16 * v + g;  // the lane's first row in the warpgroup's 64
    named_barrier_sync(bar, 128);  // every warp is done with the previous job's Q and P
    for (int rr = 0; rr < 2; ++rr)
        for (int n = 0; n < NT; ++n) {
            const int col = n * 8 + 2 * c;
            const u32 x = ctx[rr] > 0 ? pat_pack(a.q[orow[rr] + col], a.q[orow[rr] + col + 1]) : 0u;
            *reinterpret_cast<u32*>(qs + paw_at(r0 + 8 * rr, col, D)) = x;
        }
    fence_proxy_async();
    named_barrier_sync(bar, 128);
    const u64 dq = paw_desc(qs, D), dp = paw_desc(ps, PAT_TILE);

    float o[NT][4], S[32], m[2], l[2], macc[2], lacc[2];
    for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    m[0] = m[1] = macc[0] = macc[1] = neg_inf_f32();
    l[0] = l[1] = lacc[0] = lacc[1] = 0.0f;
    const int ntiles = (ke - kb + PAT_TILE - 1) / PAT_TILE;
    for (int tile = 0; tile < ntiles; ++tile, ++it) {
        const int s = it % NS;
        mbar_wait(&full[s], ((it / NS) & 1) ^ (TANDEM_PAW_BREAK == 1 ? 1 : 0));
        const unsigned char* kt = base + s * 2 * PawCfg<D>::TILE;
        const u64 dk = paw_desc(kt, D), dv = paw_desc(kt + PawCfg<D>::TILE, PAT_TILE);
        const int k0 = kb + tile * PAT_TILE;
        // s = q . k over the tile's 64 keys, dims in ascending k16 steps (tc's K stage).
#pragma unroll
        for (int i = 0; i < 32; ++i) S[i] = 0.0f;
        wgmma_fence_regs(S);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) wgmma_m64n64k16(bf16_t{}, S, dq + 16 * ks, dk + 16 * ks);  // + 256 bytes (>> 4)
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(S);
        // Register 4 n + i: key 8 n + 2 c + (i & 1) of the tile, row g + 8 (i >> 1) (tc's S[n][i]).
        for (int n = 0; n < 8; ++n)
            for (int i = 0; i < 4; ++i) {
                const int kk = (n & 1) * 8 + 2 * c + (i & 1), key = k0 + 8 * n + 2 * c + (i & 1);
                const u32 badm = bad_s[s * 4 + (n >> 1)];
                float& x = S[4 * n + i];
                x = key >= ctx[i >> 1] || key < lo(i >> 1) ? neg_inf_f32() : ((badm >> kk) & 1u) ? nan_f32() : x * a.scale_log2;
            }
        // The tile's online-softmax step, per row (tc's): a tile before the row's base leaves it.
        for (int rr = 0; rr < 2; ++rr) {
            const bool before = k0 < base_of(rr);
            float mx = neg_inf_f32();
            for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(S[4 * n + 2 * rr], S[4 * n + 2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = before ? m[rr] : fmaxf(m[rr], mx), alpha = before ? 1.0f : exp2f(m[rr] - mn);
            float rs = 0.0f;
            for (int n = 0; n < 8; ++n)
                for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
                    S[4 * n + e] = before ? 0.0f : exp2f(S[4 * n + e] - mn);
                    rs += S[4 * n + e];
                }
            rs += __shfl_xor_sync(0xffffffffu, rs, 1);
            rs += __shfl_xor_sync(0xffffffffu, rs, 2);
            l[rr] = before ? l[rr] : fmaf(l[rr], alpha, rs);
            m[rr] = mn;
            for (int n = 0; n < NT; ++n) {
                o[n][2 * rr] *= alpha;
                o[n][2 * rr + 1] *= alpha;
            }
        }
        // bf16(p) into the warpgroup's P tile, once every warp is done with the previous one.
        named_barrier_sync(bar, 128);
        const int prow = TANDEM_PAW_BREAK == 3 ? g : r0;
        for (int n = 0; n < 8; ++n)
            for (int rr = 0; rr < 2; ++rr)
                *reinterpret_cast<u32*>(ps + paw_at(prow + 8 * rr, 8 * n + 2 * c, PAT_TILE)) = pat_pack(S[4 * n + 2 * rr], S[4 * n + 2 * rr + 1]);
        fence_proxy_async();
        if (TANDEM_PAW_BREAK == 2) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);  // the bug: V is still to be read
        }
        named_barrier_sync(bar, 128);
        paw_pv<D>(o, dp, dv);
        if (TANDEM_PAW_BREAK != 2) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);  // this warp has read the stage's K and V
        }
        // Each row whose partition (or context) ends with this tile folds (tc's conditions).
        for (int rr = 0; rr < 2; ++rr) {
            if (ctx[rr] <= k0 || k0 < base_of(rr)) continue;
            const bool last = ctx[rr] <= k0 + PAT_TILE;
            if (!last && (k0 + PAT_TILE - base_of(rr)) % plen[rr] != 0) continue;
            const bool first = k0 < base_of(rr) + plen[rr];
            pat_chunk_fold<D>(a, o, m, l, macc, lacc, orow, c, rr, first, last);
        }
    }
}

// Chunk blocks (PAW_ROW_WARPS tw tokens and one KV-head group each) for tokens n_split on.
template <int D>
__device__ __forceinline__ void paged_attention_wgmma_impl(const PatArgs& a) {
    PDL_WAIT();
    PDL_LAUNCH_DEPENDENTS();
    TANDEM_DYNAMIC_SMEM(smem_raw);
    unsigned char* base = smem_raw + ((128u - (smem_u32(smem_raw) & 127u)) & 127u);
    const int H = a.num_heads, KVH = a.num_kv_heads;
    if (KVH < 1 || H % KVH != 0 || a.tw < 1) return;
    const int gqa = H / KVH, HG = (gqa + 15) / 16, groups = KVH * HG;
    if (a.tw * min(gqa, 16) > 16) return;
    const int rest = a.num_tokens - a.n_split, bt = PAW_ROW_WARPS * a.tw;
    const long chunk_blocks = (long)((rest + bt - 1) / bt) * groups;
    const long b = (long)blockIdx.x;
    if (b >= chunk_blocks) return;
    constexpr int NS = PawCfg<D>::NS;
    u64* full = (u64*)(base + PawCfg<D>::BAR_AT);
    u64* empty = full + NS;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; ++s) {
            mbar_init(&full[s], 128);             // every producer thread
            mbar_init(&empty[s], PAW_ROW_WARPS);  // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();
    const bool producer = threadIdx.x < 128;
    if constexpr (D == 256) {
        if (producer) setmaxnreg_dec<40>();
        else setmaxnreg_inc<232>();
    }
    // The last chunk first: a prompt's last tokens have the longest contexts.
    const int chunk = (int)((chunk_blocks - 1 - b) / groups), grp = (int)(b % groups), kh = grp / HG, hg = grp % HG;
    const int G = min(16, gqa - hg * 16), h0 = kh * gqa + hg * 16;
    const int t_begin = a.n_split + chunk * bt, t_end = min(a.num_tokens, t_begin + bt);
    int it = 0;  // the block's tile count: ring stage it % NS, phase (it / NS) & 1
    for (int t0 = t_begin; t0 < t_end;) {
        int t1 = t0 + 1;
        while (t1 < t_end && a.token_seq[t1] == a.token_seq[t0]) ++t1;
        int kb, ke;
        paw_keys(a, t0, t1, kb, ke);
        if (producer) {
            if (kb < ke) paw_produce<D>(a, t0, kh, kb, ke, base, full, empty, it);
        } else {
            paw_consume<D>(a, t0, t1, kh, h0, G, kb, ke, base, full, empty, it);
        }
        t0 = t1;
    }
}

#define PAW_KERNEL(D)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(PAW_THREADS, 1) paged_attention_wgmma_d##D(                          \
        const float* __restrict__ q, const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,          \
        const u32* __restrict__ positions, const u32* __restrict__ token_seq, const u32* __restrict__ block_tables, \
        float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml, u32* __restrict__ counters, \
        int num_tokens, int n_split, int num_heads, int num_kv_heads, int block_size, int num_blocks, int num_seqs,   \
        int max_blocks, int max_parts, int tw, float scale, int window) {                                              \
        const PatArgs a{q,         k_cache,    v_cache,    positions,  token_seq,  block_tables, out,                  \
                        part_out,  part_ml,    counters,   num_tokens, n_split,    num_heads,    num_kv_heads,         \
                        block_size, num_blocks, num_seqs,  max_blocks, max_parts,  tw,           scale * PAT_LOG2E,    \
                        window};                                                                                       \
        paged_attention_wgmma_impl<D>(a);                                                                              \
    }
PAW_KERNEL(64)
PAW_KERNEL(128)
PAW_KERNEL(256)
#endif
