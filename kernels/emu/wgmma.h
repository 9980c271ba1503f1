// wgmma.h — the Hopper (sm_90a) instructions kernels/matmul_sm90.cu uses, for cuda_emu.h
// (included at its end; the kernels reach these through common.cuh's sm_90 wrappers).
//
// Shared-memory addresses: a descriptor, a TMA destination and an mbarrier are named on the GPU
// by their address in the shared window. Here that is the offset in the block's dynamic shared
// memory (smem_offset; the arena is 1024-byte aligned, so address bits 4-9, which the 128-byte
// swizzle reads, are those of a GPU whose dynamic shared memory starts 1024-aligned).
//
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}, A and B from shared memory through
// matrix descriptors, both K-major (no transpose), scale-d 1 (D = A·B + D). PTX ISA,
// "Asynchronous Warpgroup Level Matrix ...":
//   - descriptor (64 bits): start address >> 4 in bits 0-13, leading dimension byte offset
//     (LBO) >> 4 in 16-29, stride dimension byte offset (SBO) >> 4 in 32-45, base offset in
//     49-51 (must be 0 here), swizzle mode in 62-63 (0 none, 1 128-byte; 2 and 3, the 64- and
//     32-byte modes, are refused);
//   - K-major operand, element (row i of M or N, column kk of K) in a layout of core matrices of
//     8 rows x 16 bytes: no swizzle: start + (i/8) SBO + (kk/8) LBO + (i%8) 16 + (kk%8) 2;
//     128-byte swizzle: rows of 128 bytes, 8-row atoms SBO apart, the address start + (i/8) SBO
//     + (i%8) 128 + 2 kk with its 16-byte chunk bits (4-6) XORed with bits 7-9 (LBO unused);
//     the start of the k16 step j within an atom is the atom's + 32 j (as CUTLASS advances it);
//   - accumulator D of the warpgroup (threads 128 w + 32 v + l, warp v, g = l / 4, t = l % 4):
//     register i holds row 16 v + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 t + i % 2;
//   - every element: acc = D; acc += A[r][kk] * B[kk][c] for kk = 0..15 in ascending order, each
//     add rounded to f32 — exactly the order cuda_emu.h's mma.sync m16n8k16 uses, so a kernel
//     that walks the same k16 chunks in the same sequence gets the same bits here. Whether the
//     HARDWARE's wgmma sums one k16 chunk as its mma.sync does is not documented: a GPU check
//     must compare the two bitwise (tests/cuda, gpu/tune.sh).
//   - asynchrony: an issued wgmma does nothing until the wait_group that covers its commit
//     group; then it reads A and B from shared memory and writes D. wgmma.wait_group N
//     completes every committed group but the newest N, in issue order; wgmmas on one
//     accumulator chain (a later one adds to what the earlier left), so a main loop may keep
//     a group in flight while it issues the next tile's onto the same D. So a kernel that reads D
//     before waiting sees the old values, and one that lets a stage be overwritten before the
//     wait reads the new bytes (TMA poisons them). A wgmma issued with no wgmma.fence since the
//     thread's last wait_group (or its start), or D changed between issue and wait, aborts.
// mbarrier (init, arrive, arrive.expect_tx, try_wait.parity), state kept in its 8 bytes:
//   expected and pending arrivals, the transaction count, the phase's parity, and a tag (an
//   mbarrier never initialised — shared memory is poisoned — aborts). A phase completes when
//   the pending arrivals and the transaction count are both 0: then the parity flips and the
//   arrivals re-arm. try_wait.parity(P) is true iff the current phase's parity is not P (the
//   phase of parity P has completed; on a fresh barrier P = 1 counts as complete, as on the
//   GPU). An arrive yields the fiber (a scheduling point), so a consumer that releases a stage
//   early lets the producer refill it before the consumer's own late reads.
// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes from a tensor
//   map (encode_tensor_map_2d: cuTensorMapEncodeTiled's dims, row stride, box, swizzle, in our
//   own layout of the 128 opaque bytes): at issue the box's bytes in shared memory are poisoned
//   (0xFF: NaN); the copy lands (and completes its bytes on the mbarrier) only when a thread
//   waits on that mbarrier and finds the phase incomplete. So a wait with the wrong parity, a
//   missing wait, or an arrive without expect_tx (the phase completes before the bytes are
//   counted) reads poison. Out-of-bounds box elements are zeros; 128-byte swizzle as above.
#pragma once
#include <algorithm>
#include <map>
#include <memory>

namespace emu {

inline uint32_t smem_offset(const void* p) {
    const unsigned char* c = (const unsigned char*)p;
    if (!block || !block->smem || c < block->smem || c >= block->smem + block->smem_bytes)
        die("sm_90 operand outside the block's dynamic shared memory");
    return (uint32_t)(c - block->smem);
}
inline unsigned char* smem_at(uint32_t off, uint32_t bytes) {
    if (!block->smem || (size_t)off + bytes > block->smem_bytes) die("sm_90 shared-memory address past the dynamic shared memory");
    return block->smem + off;
}
// The 128-byte swizzle: 16-byte chunk index (bits 4-6) XOR the 128-byte row (bits 7-9).
inline uint32_t swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }

// Element (i: row of M or N, kk: column of K, 0..15) of a K-major operand.
inline uint32_t desc_elem_addr(uint64_t desc, int i, int kk) {
    const uint32_t start = (uint32_t)(desc & 0x3fffu) << 4, lbo = (uint32_t)((desc >> 16) & 0x3fffu) << 4,
                   sbo = (uint32_t)((desc >> 32) & 0x3fffu) << 4;
    const unsigned base_off = (unsigned)((desc >> 49) & 7u), mode = (unsigned)(desc >> 62);
    if (base_off != 0) die("wgmma: descriptor base offset not 0 (not emulated)");
    if (mode == 0) return start + (uint32_t)(i / 8) * sbo + (uint32_t)(kk / 8) * lbo + (uint32_t)(i % 8) * 16 + (uint32_t)(kk % 8) * 2;
    if (mode == 1) return swizzle128(start + (uint32_t)(i / 8) * sbo + (uint32_t)(i % 8) * 128 + (uint32_t)kk * 2);
    die("wgmma: 64- and 32-byte swizzle modes are not emulated");
}

struct WgOp {
    float* d;
    int n;
    uint64_t da, db;
    bool f16;
    long group;  // -1 until committed
    std::vector<float> snapshot;  // D at issue: must be unchanged at the wait
};
struct WgThread {
    unsigned long serial = 0;  // block_serial of the block this state belongs to
    std::vector<WgOp> ops;
    long committed = 0;
    bool fenced = false;
};
inline WgThread& wg_self() {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    // Sized for the whole block at once: a reference one fiber holds must survive another's call.
    // Kept in the block (cuda_emu.h), so blocks interleaved by the fake driver have their own.
    const size_t n = (size_t)blockDim.x * blockDim.y * blockDim.z;
    if (!block->wgmma_side) block->wgmma_side = std::make_shared<std::vector<WgThread>>(n);
    auto& wg_threads = *static_cast<std::vector<WgThread>*>(block->wgmma_side.get());
    if (wg_threads.size() < n) wg_threads.resize(n);
    WgThread& s = wg_threads[t];
    if (s.serial != block_serial) s = WgThread{block_serial, {}, 0, false};
    return s;
}

inline void wgmma_fence() { wg_self().fenced = true; }
inline void wgmma_issue(float* d, int n, uint64_t da, uint64_t db, bool f16) {
    if (n < 8 || n > 256 || n % 8) die("wgmma: N not a multiple of 8 in 8..256");
    if (blockDim.x % 128) die("wgmma: blockDim.x not a multiple of 128 (whole warpgroups)");
    if (!wg_self().fenced) die("wgmma: mma_async with no wgmma.fence since the accumulator was last accessed");
    // Every lane of a warp issues the same descriptors (warpgroup-collective, .aligned).
    const uint32_t mine[4] = {(uint32_t)da, (uint32_t)(da >> 32), (uint32_t)db, (uint32_t)(db >> 32)};
    auto set = exchange(mine, 4);
    for (unsigned l = 0; l < 32; ++l)
        if (std::memcmp(set[l], mine, sizeof mine) != 0) die("wgmma: lanes of a warp issued different descriptors");
    WgThread& s = wg_self();
    s.ops.push_back({d, n, da, db, f16, -1, std::vector<float>(d, d + n / 2)});
}
inline void wgmma_commit() {
    WgThread& s = wg_self();
    for (auto& o : s.ops)
        if (o.group < 0) o.group = s.committed;
    ++s.committed;
}
// Performs one wgmma for this thread's fragment (see the top of the file).
inline void wgmma_run(const WgOp& o) {
    const unsigned tw = threadIdx.x % 128, v = tw / 32, l = tw % 32, g = l / 4, t = l % 4;
    auto load = [&](uint32_t a) {
        uint16_t h;
        std::memcpy(&h, smem_at(a, 2), 2);
        return o.f16 ? f16_to_f32(h) : bf16_to_f32(h);
    };
    for (int i = 0; i < o.n / 2; ++i) {
        const int r = (int)(16 * v + g + 8 * ((i / 2) % 2)), c = 8 * (i / 4) + (int)(2 * t) + i % 2;
        float acc = o.d[i];
        for (int kk = 0; kk < 16; ++kk) {
            const float p = load(desc_elem_addr(o.da, r, kk)) * load(desc_elem_addr(o.db, c, kk));  // exact
            acc = acc + p;
        }
        o.d[i] = acc;
    }
}
// Completes every committed group but the newest `n`, in issue order.
inline void wgmma_wait(int n) {
    WgThread& s = wg_self();
    const long done_below = s.committed - n;
    std::vector<WgOp> keep;
    std::vector<const float*> checked;
    for (auto& o : s.ops) {
        if (o.group >= 0 && o.group < done_below) {
            if (std::find(checked.begin(), checked.end(), o.d) == checked.end()) {
                if (std::memcmp(o.d, o.snapshot.data(), sizeof(float) * o.snapshot.size()) != 0)
                    die("wgmma: accumulator registers changed between mma_async and its wait_group");
                checked.push_back(o.d);
            }
            wgmma_run(o);
            // A later wgmma on the same accumulator, still pending, was issued onto this one
            // (chained in the async unit, as a pipelined main loop keeps one group in flight):
            // what it must find unchanged at its wait is D as this one left it.
            for (auto& later : s.ops)
                if (later.group != o.group && later.d == o.d && &later != &o && (later.group < 0 || later.group >= done_below))
                    later.snapshot.assign(o.d, o.d + o.n / 2);
        } else {
            keep.push_back(std::move(o));
        }
    }
    s.ops.swap(keep);
    s.fenced = false;
}

// ---- mbarrier -------------------------------------------------------------------------------
// State in the barrier's 8 bytes: bits 0-15 expected arrivals, 16-31 pending, 32-55 the
// transaction count (signed, 24 bits), 56 the phase parity, 57-63 the tag 0x2A.
constexpr uint64_t MBAR_TAG = 0x2Aull;
struct Mbar {
    unsigned expected, pending, parity;
    long tx;
};
inline Mbar mbar_load(const unsigned long long* p) {
    const uint64_t v = *p;
    if ((v >> 57) != MBAR_TAG) die("mbarrier used before mbarrier.init");
    long tx = (long)((v >> 32) & 0xffffffu);
    if (tx & 0x800000) tx -= 0x1000000;
    return {(unsigned)(v & 0xffffu), (unsigned)((v >> 16) & 0xffffu), (unsigned)((v >> 56) & 1u), tx};
}
inline void mbar_store(unsigned long long* p, Mbar m) {
    if (m.tx >= 0x800000 || m.tx < -0x800000) die("mbarrier: transaction count out of range");
    *p = (uint64_t)m.expected | ((uint64_t)m.pending << 16) | ((uint64_t)(m.tx & 0xffffff) << 32) | ((uint64_t)m.parity << 56) | (MBAR_TAG << 57);
}
inline void mbar_settle(Mbar& m) {
    if (m.pending == 0 && m.tx == 0) {
        m.parity ^= 1u;
        m.pending = m.expected;
    }
}
inline void mbar_init(unsigned long long* p, unsigned count) {
    if (((uintptr_t)p & 7) != 0) die("mbarrier not 8-byte aligned");
    if (count == 0 || count > 0xffff) die("mbarrier.init: count outside 1..65535 (emulated range)");
    mbar_store(p, {count, count, 0, 0});
}
inline void mbar_arrive(unsigned long long* p, long tx_bytes) {
    Mbar m = mbar_load(p);
    if (m.pending == 0) die("mbarrier: more arrivals than the phase expects");
    m.tx += tx_bytes;
    --m.pending;
    mbar_settle(m);
    mbar_store(p, m);
    ++progress;
    yield();  // a scheduling point: see the top of the file
}
inline void mbar_complete_tx(unsigned long long* p, long bytes) {
    Mbar m = mbar_load(p);
    m.tx -= bytes;
    mbar_settle(m);
    mbar_store(p, m);
}

// ---- TMA --------------------------------------------------------------------------------------
// Our layout of the 128 opaque bytes of a CUtensorMap (2D only).
struct TensorMap2d {
    uint64_t tag;
    const void* base;
    uint64_t dim0, dim1;  // elements: dim0 contiguous
    uint64_t stride1;     // bytes between rows
    uint32_t box0, box1, elem_bytes, swizzle;  // swizzle: 0 none, 3 128B (CUtensorMapSwizzle)
};
constexpr uint64_t TMAP_TAG = 0x746d6170326400ull;  // "tmap2d"
static_assert(sizeof(TensorMap2d) <= 128, "a CUtensorMap is 128 bytes");
// cuTensorMapEncodeTiled for rank 2 with the checks its documentation states: global address
// 16-byte aligned, row stride a multiple of 16 bytes, box dims 1..256, the inner box a multiple
// of 16 bytes and, with the 128-byte swizzle, at most 128 bytes. Returns false where it would
// return CUDA_ERROR_INVALID_VALUE.
inline bool encode_tensor_map_2d(void* out128, const void* base, uint32_t elem_bytes, uint64_t dim0, uint64_t dim1, uint64_t stride1_bytes,
                                 uint32_t box0, uint32_t box1, uint32_t swizzle) {
    if (((uintptr_t)base & 15) || (stride1_bytes & 15) || box0 == 0 || box1 == 0 || box0 > 256 || box1 > 256 || (box0 * elem_bytes) % 16)
        return false;
    if (swizzle != 0 && swizzle != 3) return false;  // only none and 128B emulated
    if (swizzle == 3 && box0 * elem_bytes > 128) return false;
    if (dim0 == 0 || dim1 == 0 || stride1_bytes < dim0 * elem_bytes) return false;
    TensorMap2d t{TMAP_TAG, base, dim0, dim1, stride1_bytes, box0, box1, elem_bytes, swizzle};
    std::memset(out128, 0, 128);
    std::memcpy(out128, &t, sizeof t);
    return true;
}
struct TmaCopy {
    uint32_t dst;  // shared offset
    TensorMap2d map;
    int c0, c1;
    unsigned long long* bar;
};
struct TmaBlock {
    unsigned long serial = 0;
    std::vector<TmaCopy> pending;
    // The block's named barriers (bar.sync id, count), kept here with its other sm_90 state.
    std::map<unsigned, std::unique_ptr<Barrier>> named;
};
inline TmaBlock& tma_self() {
    if (!block->tma_side) block->tma_side = std::make_shared<TmaBlock>();
    TmaBlock& tma_state = *static_cast<TmaBlock*>(block->tma_side.get());
    if (tma_state.serial != block_serial) tma_state = TmaBlock{block_serial, {}, {}};
    return tma_state;
}
inline uint32_t tma_box_bytes(const TensorMap2d& t) { return t.box0 * t.box1 * t.elem_bytes; }
inline void tma_load_2d(void* dst, const void* map128, int c0, int c1, unsigned long long* bar) {
    TensorMap2d t;
    std::memcpy(&t, map128, sizeof t);
    if (t.tag != TMAP_TAG) die("cp.async.bulk.tensor: not a tensor map encode_tensor_map_2d made");
    const uint32_t off = smem_offset(dst);
    if (off % 128) die("cp.async.bulk.tensor: shared destination not 128-byte aligned");
    mbar_load(bar);  // must be initialised
    std::memset(smem_at(off, tma_box_bytes(t)), 0xff, tma_box_bytes(t));
    tma_self().pending.push_back({off, t, c0, c1, bar});
}
inline void tma_land(const TmaCopy& c) {
    const TensorMap2d& t = c.map;
    const uint32_t row_bytes = t.box0 * t.elem_bytes;
    for (uint32_t r = 0; r < t.box1; ++r)
        for (uint32_t e = 0; e < t.box0; ++e) {
            const long g0 = (long)c.c0 + e, g1 = (long)c.c1 + r;
            uint32_t a = c.dst + r * row_bytes + e * t.elem_bytes;
            if (t.swizzle == 3) a = swizzle128(a);
            unsigned char* d = smem_at(a, t.elem_bytes);
            if (g0 < 0 || g1 < 0 || (uint64_t)g0 >= t.dim0 || (uint64_t)g1 >= t.dim1) std::memset(d, 0, t.elem_bytes);
            else std::memcpy(d, (const unsigned char*)t.base + (uint64_t)g1 * t.stride1 + (uint64_t)g0 * t.elem_bytes, t.elem_bytes);
        }
    mbar_complete_tx(c.bar, tma_box_bytes(t));
    ++progress;
}
// bar.sync id, count: `count` threads (a multiple of 32, at most the block) meet at barrier
// `id` (1..15); a barrier used with two counts aborts, as one left waiting deadlocks (reported).
inline void named_barrier_sync(unsigned id, unsigned count) {
    if (id == 0 || id > 15) die("bar.sync: barrier id outside 1..15 (0 is __syncthreads')");
    if (count == 0 || count % 32 || count > blockDim.x * blockDim.y * blockDim.z) die("bar.sync: count not a multiple of 32 within the block");
    auto& slot = tma_self().named[id];
    if (!slot) slot = std::make_unique<Barrier>(count);
    if (slot->count != count) die("bar.sync: one barrier id used with two thread counts");
    slot->arrive_and_wait();
}
// try_wait.parity: lands the copies bound for this barrier if the phase is not complete yet.
inline bool mbar_try_wait_parity(unsigned long long* p, unsigned parity) {
    if (mbar_load(p).parity != (parity & 1u)) return true;
    auto& pend = tma_self().pending;
    std::vector<TmaCopy> keep, land;
    for (auto& c : pend) (c.bar == p ? land : keep).push_back(c);
    pend.swap(keep);
    for (auto& c : land) tma_land(c);
    if (mbar_load(p).parity != (parity & 1u)) return true;
    yield();
    return false;
}
}  // namespace emu
