// sm90_test.cpp — the emulator's Hopper instructions (wgmma.h) and the wgmma + TMA GEMM
// (kernels/matmul_sm90.cu), run by run.sh:
//   - wgmma m64nNk16 (N = 8, 64, 128, 256) from descriptors over hand-placed operands, no swizzle
//     and 128-byte swizzle: every accumulator register against a reference summed in the
//     documented order, bitwise; the asynchrony (D untouched before the wait; wait_group 1 leaves
//     the newest group pending; groups chained on one accumulator, as the pipelined main loop
//     issues them);
//   - TMA 2D boxes (in bounds, past the edges: zeros) with and without the 128-byte swizzle;
//     the mbarrier phase and transaction count (wrong parity, missing expect_tx read poison);
//   - misuse aborts (forked): wgmma without wgmma.fence, an mbarrier never initialised;
//   - the GEMM against f64 at awkward shapes (m, n not multiples of the 128 x 128 tile, k edge
//     tiles, K slices ending inside a 64-column k tile) and bitwise against the mma.sync kernel
//     (matmul.cu's default path for the same m) on the same inputs.
//   - every fused epilogue (EPI_QKV, EPI_QKV_ROPE at head_dim 32 / 64 / 128, EPI_SILU, EPI_RESID;
//     biases, 16-bit activation outputs, bf16 and f32 caches) at awkward m, n, k: every output
//     bitwise equal to the mma.sync kernel's.
// Run with an argument N = 1..WGMMA_BREAKS it breaks the GEMM with matmul_sm90.cu's test hook N
// (one build for all: TANDEM_WGMMA_BREAK is this program's variable), runs only the GEMM checks
// that hook reaches, and succeeds only if every one of them fails.
#include "cuda_emu.h"

static int wgmma_break = 0;
constexpr int WGMMA_BREAKS = 11;  // matmul_sm90.cu's test hooks 1..11 (10, 11: the persistent kernels)
#define TANDEM_WGMMA_BREAK wgmma_break
#include "../matmul.cu"
#include "../matmul_sm90.cu"

#include <cstdio>
#include <string>
#include <tuple>
#include <sys/wait.h>
#include <unistd.h>

#include "matmul_test.h"

namespace {
int checks = 0, failures = 0;
void check(const std::string& what, bool ok) {
    ++checks;
    if (!ok) ++failures;
    if (wgmma_break) std::printf("%s %s\n", ok ? "passed (bad: the break went unnoticed)" : "failed (as it must)", what.c_str());
    else std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

uint16_t bf(float v) { return f32_to_bf16_bits(v); }

// ---- wgmma -----------------------------------------------------------------------------------
// A [64][16] and B [N][16] (K-major) placed in shared memory by the layouts of the PTX ISA,
// written here from the description, not with wgmma.h's address function.
void wgmma_case(int n, bool swizzled) {
    std::vector<uint16_t> A(64 * 16), B((size_t)n * 16);
    std::vector<float> C((size_t)64 * n);
    for (auto& a : A) a = bf(mmtest::rnd());
    for (auto& b : B) b = bf(mmtest::rnd());
    for (auto& c : C) c = mmtest::rnd();
    // no swizzle: core matrix (8 rows x 8 elements) = 128 contiguous bytes; K neighbour 128 bytes
    // on (LBO), next 8 rows 256 bytes on (SBO). 128-byte swizzle: rows of 128 bytes (only the
    // first 32 used: one k16 step), atoms of 8 rows 1024 bytes apart; chunk ^= row % 8; the B
    // operand 32 bytes into its rows (the second k16 step of a 64-column tile).
    const uint32_t a_base = 0, b_base = swizzled ? 64 * 128 : 64 * 16 * 2, b_step = swizzled ? 32 : 0;
    auto place = [&](uint32_t base, int i, int kk, bool sw, uint32_t step) -> uint32_t {
        if (!sw) return base + (uint32_t)(i / 8) * 256 + (uint32_t)(kk / 8) * 128 + (uint32_t)(i % 8) * 16 + (uint32_t)(kk % 8) * 2;
        const uint32_t row = base + (uint32_t)i * 128, byte = step + (uint32_t)kk * 2;
        return row + (((byte / 16) ^ ((uint32_t)i % 8)) * 16) + byte % 16;
    };
    const size_t smem = swizzled ? (64 + (size_t)n) * 128 : (64 + (size_t)n) * 32;
    std::vector<float> got((size_t)64 * n, NAN), before((size_t)64 * n, NAN);
    bool async_ok = true;
    launch(dim3{1, 1, 1}, dim3{128, 1, 1}, [&] {
        unsigned char* s = emu::dynamic_smem();
        if (threadIdx.x == 0) {
            for (int i = 0; i < 64; ++i)
                for (int kk = 0; kk < 16; ++kk) std::memcpy(s + place(a_base, i, kk, swizzled, 0), &A[i * 16 + kk], 2);
            for (int i = 0; i < n; ++i)
                for (int kk = 0; kk < 16; ++kk) std::memcpy(s + place(b_base, i, kk, swizzled, b_step), &B[(size_t)i * 16 + kk], 2);
        }
        __syncthreads();
        const unsigned tw = threadIdx.x, v = tw / 32, l = tw % 32, g = l / 4, t = l % 4;
        float d[128];
        auto row = [&](int i) { return (int)(16 * v + g + 8 * ((i / 2) % 2)); };
        auto col = [&](int i) { return 8 * (i / 4) + (int)(2 * t) + i % 2; };
        for (int i = 0; i < n / 2; ++i) d[i] = C[(size_t)row(i) * n + col(i)];
        const u64 da = swizzled ? wgmma_desc(a_base, 16, 1024, 1) : wgmma_desc(a_base, 128, 256, 0);
        const u64 db = swizzled ? wgmma_desc(b_base + b_step, 16, 1024, 1) : wgmma_desc(b_base, 128, 256, 0);
        wgmma_fence();
        emu::wgmma_issue(d, n, da, db, false);
        wgmma_commit();
        for (int i = 0; i < n / 2; ++i) async_ok = async_ok && d[i] == C[(size_t)row(i) * n + col(i)];
        wgmma_wait<0>();
        for (int i = 0; i < n / 2; ++i) got[(size_t)row(i) * n + col(i)] = d[i];
    }, smem);
    bool same = true;
    for (int r = 0; r < 64; ++r)
        for (int c = 0; c < n; ++c) {
            float acc = C[(size_t)r * n + c];
            for (int kk = 0; kk < 16; ++kk) acc = acc + bf16_bits_to_f32(A[r * 16 + kk]) * bf16_bits_to_f32(B[(size_t)c * 16 + kk]);
            same = same && std::memcmp(&acc, &got[(size_t)r * n + c], 4) == 0;
        }
    check("wgmma m64n" + std::to_string(n) + "k16 bf16 " + (swizzled ? "128-byte swizzle" : "no swizzle") +
              ": every register bitwise equal to the reference (ascending-k f32 adds, the fragment layout of the PTX ISA)",
          same);
    check("wgmma m64n" + std::to_string(n) + "k16: the accumulator is untouched until wait_group", async_ok);
}

// Two groups on two accumulators: wait_group 1 completes the older only.
void wgmma_wait_groups() {
    bool ok = true;
    launch(dim3{1, 1, 1}, dim3{128, 1, 1}, [&] {
        unsigned char* s = emu::dynamic_smem();
        for (unsigned i = threadIdx.x; i < 64 * 16 + 8 * 16; i += 128) {
            const uint16_t one = bf(1.0f);
            std::memcpy(s + 2 * i, &one, 2);
        }
        __syncthreads();
        float d1[4] = {0, 0, 0, 0}, d2[4] = {0, 0, 0, 0};
        const u64 da = wgmma_desc(0, 128, 256, 0), db = wgmma_desc(64 * 16 * 2, 128, 256, 0);
        wgmma_fence();
        emu::wgmma_issue(d1, 8, da, db, false);
        wgmma_commit();
        emu::wgmma_issue(d2, 8, da, db, false);
        wgmma_commit();
        wgmma_wait<1>();
        ok = ok && d1[0] == 16.0f && d1[3] == 16.0f && d2[0] == 0.0f;
        wgmma_wait<0>();
        ok = ok && d2[0] == 16.0f && d2[3] == 16.0f;
    }, 64 * 16 * 2 + 8 * 16 * 2);
    check("wgmma wait_group 1 completes all but the newest commit group, wait_group 0 the rest", ok);
    // A pipelined main loop: group 2 issued onto the accumulator group 1 still writes; wait_group 1
    // completes group 1 only, and group 2 then adds to what group 1 left (no abort: D was changed
    // by the async unit, not by the thread).
    bool chained = true;
    launch(dim3{1, 1, 1}, dim3{128, 1, 1}, [&] {
        unsigned char* s = emu::dynamic_smem();
        for (unsigned i = threadIdx.x; i < 64 * 16 + 8 * 16; i += 128) {
            const uint16_t one = bf(1.0f);
            std::memcpy(s + 2 * i, &one, 2);
        }
        __syncthreads();
        float d[4] = {0, 0, 0, 0};
        const u64 da = wgmma_desc(0, 128, 256, 0), db = wgmma_desc(64 * 16 * 2, 128, 256, 0);
        wgmma_fence();
        emu::wgmma_issue(d, 8, da, db, false);
        wgmma_commit();
        wgmma_fence();
        emu::wgmma_issue(d, 8, da, db, false);
        wgmma_commit();
        wgmma_wait<1>();
        chained = chained && d[0] == 16.0f && d[3] == 16.0f;
        wgmma_fence();
        emu::wgmma_issue(d, 8, da, db, false);
        wgmma_commit();
        wgmma_wait<1>();
        chained = chained && d[0] == 32.0f;
        wgmma_wait<0>();
        chained = chained && d[0] == 48.0f && d[3] == 48.0f;
    }, 64 * 16 * 2 + 8 * 16 * 2);
    check("wgmma groups chained on one accumulator (one group in flight): wait_group 1 completes the older, the newer adds to its result", chained);
}

// ---- TMA + mbarrier --------------------------------------------------------------------------
void tma_case(bool swizzled) {
    const int rows = 100, cols = 72, pitch = 80;  // global [rows][pitch] bf16, dims {cols, rows}
    std::vector<uint16_t> g((size_t)rows * pitch);
    for (size_t i = 0; i < g.size(); ++i) g[i] = (uint16_t)(i * 7 + 1);
    TmaMap map;
    const bool enc = emu::encode_tensor_map_2d(&map, g.data(), 2, cols, rows, pitch * 2, 64, 32, swizzled ? 3 : 0);
    const int c0 = 40, c1 = 90;  // box columns 40..103 (past 72), rows 90..121 (past 100)
    bool data_ok = true, parity_ok = true;
    launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
        unsigned char* s = emu::dynamic_smem();
        u64* bar = reinterpret_cast<u64*>(s + 4096);
        if (threadIdx.x == 0) mbar_init(bar, 1);
        __syncwarp();
        if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(bar, 64 * 32 * 2);
            tma_load_2d(s, &map, c0, c1, bar);
        }
        parity_ok = parity_ok && mbar_try_wait(bar, 1);  // the fresh barrier's "previous" phase
        mbar_wait(bar, 0);
        parity_ok = parity_ok && mbar_try_wait(bar, 0) && !mbar_try_wait(bar, 1);
        if (threadIdx.x == 0)
            for (int r = 0; r < 32; ++r)
                for (int e = 0; e < 64; ++e) {
                    uint32_t a = (uint32_t)(r * 128 + e * 2);
                    if (swizzled) a = a ^ (((a >> 7) & 7u) << 4);
                    uint16_t h;
                    std::memcpy(&h, s + a, 2);
                    const int gr = c1 + r, gc = c0 + e;
                    const uint16_t want = gr < rows && gc < cols ? g[(size_t)gr * pitch + gc] : 0;
                    data_ok = data_ok && h == want;
                }
    }, 4096 + 8);
    check(std::string("TMA 2D box over the m and k edges, ") + (swizzled ? "128-byte swizzle" : "no swizzle") +
              ": every element where the layout puts it, out of bounds as zeros",
          enc && data_ok);
    check("mbarrier try_wait.parity: the fresh barrier's parity 1 counts as complete, parity 0 once the bytes landed", parity_ok);
}

// The model catches a wrong parity and an arrive without expect_tx: the data read is poison.
void tma_misuse() {
    std::vector<uint16_t> g(64 * 8, bf(1.0f));
    TmaMap map;
    emu::encode_tensor_map_2d(&map, g.data(), 2, 64, 8, 128, 64, 8, 3);
    for (int mode = 0; mode < 2; ++mode) {
        bool poisoned = false;
        launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
            unsigned char* s = emu::dynamic_smem();
            u64* bar = reinterpret_cast<u64*>(s + 1024);
            if (threadIdx.x == 0) {
                mbar_init(bar, 1);
                if (mode == 0) mbar_arrive_expect_tx(bar, 64 * 8 * 2);
                else mbar_arrive(bar);  // no expect_tx: the phase completes at once
                tma_load_2d(s, &map, 0, 0, bar);
                mbar_wait(bar, mode == 0 ? 1 : 0);  // mode 0: the wrong parity
                uint16_t h;
                std::memcpy(&h, s, 2);
                poisoned = h == 0xffff;
            }
        }, 1024 + 8);
        check(mode == 0 ? "mbarrier: a wait with the wrong parity returns before the TMA bytes land (poison read)"
                        : "mbarrier: an arrive without expect_tx completes the phase before the TMA bytes land (poison read)",
              poisoned);
    }
}

// A forked child runs f; it must abort with `msg` on stderr.
template <typename F>
void dies(const std::string& what, const char* msg, F f) {
    std::fflush(stdout);
    int fds[2];
    if (pipe(fds) != 0) return check(what + ": pipe", false);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        f();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, (size_t)r);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    check(what, !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && err.find(msg) != std::string::npos);
}
void misuse_aborts() {
    dies("wgmma without wgmma.fence aborts", "no wgmma.fence", [] {
        launch(dim3{1, 1, 1}, dim3{128, 1, 1}, [] {
            float d[4] = {0, 0, 0, 0};
            emu::wgmma_issue(d, 8, wgmma_desc(0, 128, 256, 0), wgmma_desc(0, 128, 256, 0), false);
        }, 4096);
    });
    dies("an mbarrier used before init aborts", "before mbarrier.init", [] {
        launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [] { mbar_arrive(reinterpret_cast<u64*>(emu::dynamic_smem())); }, 64);
    });
}

// ---- the GEMM --------------------------------------------------------------------------------
// matmul.rs's wgmma launch: x f32 -> xa (matmul_x), the tensor maps, grid (ceil(n/128),
// ceil(m/128)), 384 threads, WGMMA_SMEM_BYTES; the epilogue's arguments as the tile kernels take them.
// `ws_bn` 128 or 256: the persistent kernels matmul_wgmma_ws(256)_<dt> instead, on `ws_blocks`
// blocks (matmul.rs: min(tiles, SMs); here few, so that each block walks several tiles).
int ws_bn = 0;
unsigned ws_blocks = 3;
void run_wgmma_ep(int dt, const float* x, const uint16_t* w, const uint16_t* bias, int m, int n, int k, const Epilogue& ep, const RopeKv& rk) {
    const int kp = (k + 7) / 8 * 8;
    std::vector<uint16_t> xa((size_t)m * kp + 8, 0xffff);
    launch(dim3{(unsigned)m, 1, 1}, dim3{256, 1, 1}, [&] {
        if (dt == 1) matmul_x_bf16(x, xa.data(), m, k, kp);
        else matmul_x_f16(x, xa.data(), m, k, kp);
    });
    const int bn = ws_bn ? ws_bn : WGMMA_BN;
    TmaMap xm, wm;
    const bool ok = emu::encode_tensor_map_2d(&xm, xa.data(), 2, (uint64_t)k, (uint64_t)m, (uint64_t)kp * 2, WGMMA_BK, WGMMA_BM, 3) &&
                    emu::encode_tensor_map_2d(&wm, w, 2, (uint64_t)k, (uint64_t)n, (uint64_t)k * 2, WGMMA_BK, (uint32_t)bn, 3);
    if (!ok) return;
    const int bias_code = bias ? dt + 1 : 0;
    const void* bp = bias ? (const void*)bias : (const void*)w;
    const int slice_len = mmtest::k_slices(n, k).len;
    if (ws_bn) {
        const unsigned tiles = (unsigned)(((n + bn - 1) / bn) * ((m + WGMMA_BM - 1) / WGMMA_BM));
        const dim3 grid{std::min(tiles, ws_blocks), 1, 1};
        launch(grid, dim3{WGMMA_THREADS, 1, 1}, [&] {
            auto f = ws_bn == 256 ? (dt == 1 ? matmul_wgmma_ws256_bf16 : matmul_wgmma_ws256_f16) : (dt == 1 ? matmul_wgmma_ws_bf16 : matmul_wgmma_ws_f16);
            f(xm, wm, bp, bias_code, ep.out0, ep.out1, ep.out2, ep.kind, ep.n0, ep.n1, ep.gamma, ep.gamma_dtype, ep.act16, m, n, k, slice_len, rk);
        }, WGMMA_WS_SMEM(ws_bn));
        return;
    }
    const dim3 grid{(unsigned)((n + WGMMA_BN - 1) / WGMMA_BN), (unsigned)((m + WGMMA_BM - 1) / WGMMA_BM), 1};
    launch(grid, dim3{WGMMA_THREADS, 1, 1}, [&] {
        if (dt == 1) matmul_wgmma_bf16(xm, wm, bp, bias_code, ep.out0, ep.out1, ep.out2, ep.kind, ep.n0, ep.n1, ep.gamma, ep.gamma_dtype, ep.act16, m, n, k, slice_len, rk);
        else matmul_wgmma_f16(xm, wm, bp, bias_code, ep.out0, ep.out1, ep.out2, ep.kind, ep.n0, ep.n1, ep.gamma, ep.gamma_dtype, ep.act16, m, n, k, slice_len, rk);
    }, WGMMA_SMEM_BYTES);
}
std::string kernel_name(int dt) {
    const char* v = ws_bn == 256 ? "matmul_wgmma_ws256_" : ws_bn ? "matmul_wgmma_ws_" : "matmul_wgmma_";
    return std::string(v) + (dt == 1 ? "bf16" : "f16") + (ws_bn ? " (" + std::to_string(ws_blocks) + " blocks)" : std::string());
}
std::vector<float> run_wgmma(const mmtest::Problem& p) {
    std::vector<float> out((size_t)p.m * p.n, NAN);
    run_wgmma_ep(p.dt, p.x.data(), p.w.data(), p.bias ? p.b.data() : nullptr, p.m, p.n, p.k, Epilogue{out.data(), nullptr, nullptr, EPI_PLAIN, 0, 0}, RopeKv{});
    return out;
}

// A fused epilogue through the wgmma kernel and through the mma.sync kernel matmul.cu's launch
// takes for the same m (mmtest::gemm), from the same inputs and the same starting outputs:
// every output bitwise equal. kind: EPI_QKV (n0 = nq, n1 = nkv), EPI_QKV_ROPE (the same, head
// dim hd, a bf16 or f32 cache, one row's slot out of range), EPI_SILU (n0 = inter: the fused
// gate/up weight of fuse_gate_up_rows(inter) rows; act16: out stored in 16 bits), EPI_RESID
// (n0 = n; h += the result, hg = h * gamma unless no_hg; act16: hg in 16 bits).
struct EpCase {
    int kind, dt, m, n0, n1, k;
    bool bias;
    int hd = 0;
    bool act16 = false, cache_bf16 = false, no_hg = false;
};
const char* epi_name(int kind) {
    return kind == EPI_QKV ? "EPI_QKV" : kind == EPI_QKV_ROPE ? "EPI_QKV_ROPE" : kind == EPI_SILU ? "EPI_SILU" : kind == EPI_RESID ? "EPI_RESID" : "EPI_PLAIN";
}
void epi_case(const EpCase& e) {
    const int m = e.m, k = e.k, dt = e.dt;
    const int n = e.kind == EPI_SILU ? (e.n0 + 31) / 32 * 64 : e.kind == EPI_RESID ? e.n0 : e.n0 + 2 * e.n1;
    const mmtest::Problem p = mmtest::problem(dt, m, n, k, e.bias);
    // Every output buffer m x n floats (more than any epilogue writes), NaN or random to start.
    const size_t len = (size_t)m * n;
    std::vector<float> init[3];
    for (auto& b : init) b.assign(len, NAN);
    if (e.kind == EPI_RESID)
        for (auto& v : init[0]) v = 4.0f * mmtest::rnd();
    std::vector<uint16_t> gamma;
    for (int i = 0; i < n; ++i) gamma.push_back(dt == 1 ? f32_to_bf16_bits(1.0f + 0.5f * mmtest::rnd()) : f32_to_f16_bits(1.0f + 0.5f * mmtest::rnd()));
    const unsigned long long num_slots = (unsigned long long)m + 7;
    std::vector<u32> pos, slots;
    for (int r = 0; r < m; ++r) {
        pos.push_back((u32)((r * 977 + 13) % 5000));
        slots.push_back(r == m / 2 ? (u32)num_slots : (u32)((r * 5 + 3) % num_slots));
    }
    std::vector<float> inv_freq;
    for (int i = 0; i < e.hd / 2; ++i) inv_freq.push_back((float)std::pow(10000.0, -2.0 * i / e.hd));
    const size_t cache_bytes = e.kind == EPI_QKV_ROPE ? (size_t)num_slots * e.n1 * 4 : 4;
    std::vector<unsigned char> cache0(2 * cache_bytes);
    for (auto& c : cache0) c = (unsigned char)(mmtest::rnd() * 100.0f);  // finite either way: a bf16's high byte < 0x7f
    struct Out {
        std::vector<float> b[3];
        std::vector<unsigned char> cache;
    };
    auto run = [&](bool wgmma, std::string* kernel) {
        Out o{{init[0], init[1], init[2]}, cache0};
        const bool qkv = e.kind == EPI_QKV || e.kind == EPI_QKV_ROPE;
        Epilogue ep{o.b[0].data(), e.kind == EPI_QKV || (e.kind == EPI_RESID && !e.no_hg) ? o.b[1].data() : nullptr, e.kind == EPI_QKV ? o.b[2].data() : nullptr,
                    e.kind, qkv || e.kind == EPI_SILU ? e.n0 : 0, qkv ? e.n1 : 0};
        if (e.kind == EPI_RESID) ep.gamma = gamma.data(), ep.gamma_dtype = dt + 1;
        ep.act16 = e.act16 ? 1 : 0;
        RopeKv rk{};
        if (e.kind == EPI_QKV_ROPE) rk = RopeKv{pos.data(), inv_freq.data(), slots.data(), o.cache.data(), o.cache.data() + cache_bytes, num_slots, e.hd, e.cache_bf16 ? 1 : 0};
        const uint16_t* bias = e.bias ? p.b.data() : nullptr;
        if (wgmma) run_wgmma_ep(dt, p.x.data(), p.w.data(), bias, m, n, k, ep, rk);
        else mmtest::gemm(dt, p.x.data(), p.w.data(), bias, m, n, k, mmtest::k_slices(n, k), ep, false, kernel, NormIn{nullptr, 0, 0.0f}, rk);
        return o;
    };
    std::string kernel;
    const Out got = run(true, nullptr), want = run(false, &kernel);
    bool same = got.cache == want.cache, wrote = got.cache != cache0 || e.kind != EPI_QKV_ROPE;
    for (int i = 0; i < 3; ++i) {
        same = same && std::memcmp(got.b[i].data(), want.b[i].data(), 4 * len) == 0;
        wrote = wrote && (i > 0 || std::memcmp(got.b[0].data(), init[0].data(), 4 * len) != 0);
    }
    char buf[384];
    std::snprintf(buf, sizeof buf, "%s %s m=%d n=%d k=%d%s%s%s%s%s: every output bitwise equal to %s", kernel_name(dt).c_str(), epi_name(e.kind), m, n,
                  k, e.bias ? " bias" : "", e.hd ? (" head_dim " + std::to_string(e.hd)).c_str() : "", e.kind == EPI_QKV_ROPE ? (e.cache_bf16 ? " bf16 cache" : " f32 cache") : "",
                  e.act16 ? " act16" : "", e.no_hg ? " no hg" : "", kernel.c_str());
    check(buf, same && wrote);
}
const EpCase EPI_CASES[] = {
    {EPI_QKV, 1, 200, 96, 40, 1000, true},
    {EPI_QKV, 2, 137, 128, 64, 136, false},
    {EPI_QKV_ROPE, 1, 200, 192, 64, 1000, true, 64, false, true},
    {EPI_QKV_ROPE, 2, 300, 512, 128, 136, true, 128, false, false},
    {EPI_QKV_ROPE, 1, 129, 96, 32, 520, false, 32, false, false},
    {EPI_SILU, 1, 200, 70, 0, 1000, false},
    {EPI_SILU, 2, 137, 160, 0, 136, false, 0, true},
    {EPI_RESID, 1, 200, 200, 0, 1000, false},
    {EPI_RESID, 2, 150, 72, 0, 136, false, 0, true},
    {EPI_RESID, 1, 129, 130, 0, 520, false, 0, false, false, true},
};
void gemm_case(int dt, int m, int n, int k, bool bias) {
    const mmtest::Problem p = mmtest::problem(dt, m, n, k, bias);
    const auto got = run_wgmma(p);
    const mmtest::Slices sl = mmtest::k_slices(n, k);
    mmtest::check_f64(check, kernel_name(dt) + " slices " + std::to_string(sl.count) + " of " +
                                 std::to_string(sl.len),
                      p, got, sl.count);
    if (wgmma_break) return;
    std::string kernel;
    const auto ref = mmtest::run(dt, p.x.data(), p.w.data(), p.bias ? p.b.data() : nullptr, m, n, k, &kernel);
    check(kernel_name(dt) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ": bitwise equal to " + kernel,
          std::memcmp(got.data(), ref.data(), 4 * got.size()) == 0);
}
}  // namespace

// Runs f in a forked child; the check passes when the child's checks all passed. A break may
// also make the emulator abort (e.g. break 3 arrives on a stage's barrier more often than it
// expects), which counts as caught.
template <typename F>
void in_child(const std::string& what, F f) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        f();
        std::fflush(stdout);
        _exit(failures == 0 ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    check("(child) " + what + (WIFSIGNALED(st) ? ": the emulator aborted" : ""), WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char** argv) {
    wgmma_break = argc > 1 ? std::atoi(argv[1]) : 0;
    if (wgmma_break < 0 || wgmma_break > WGMMA_BREAKS) return 2;
    if (!wgmma_break) {
        for (int n : {8, 64, 128, 256}) wgmma_case(n, false);
        for (int n : {8, 128, 256}) wgmma_case(n, true);
        wgmma_wait_groups();
        tma_case(false);
        tma_case(true);
        tma_misuse();
        misuse_aborts();
        check("matmul_wgmma shared memory: 4 stages of 32 KiB, the barriers, 8 warps' 16 x 129 floats and 1 KiB of alignment slack (matmul.rs WGMMA_SMEM)",
              WGMMA_SMEM_BYTES == 198208);
        // m, n not multiples of 128; k = 1000: 3 slices of 352 (slices end inside 64-column k tiles),
        // k tail 40 of a tile; k = 136: 1 slice, a tail of 8; k = 40: one partial k tile.
        gemm_case(1, 200, 200, 1000, true);
        gemm_case(1, 129, 72, 136, false);
        gemm_case(2, 300, 130, 40, true);
        gemm_case(2, 137, 264, 1000, false);
        gemm_case(1, 5, 72, 1000, true);  // m <= 128: the mma.sync path splits K there; the bits agree
        for (const EpCase& e : EPI_CASES) epi_case(e);
        // The persistent kernels, on 3 blocks (and on 1 and 7): 128 x 128 tiles at every shape
        // and epilogue above; 128 x 256 tiles where the GEMM has one K slice (k < 512 here).
        check("matmul_wgmma_ws shared memory: 198208 bytes at 128 x 128, 214576 at 128 x 256 (matmul.rs WGMMA_WS_SMEM)",
              WGMMA_WS_SMEM(128) == 198208 && WGMMA_WS_SMEM(256) == 214576);
        ws_bn = 128;
        gemm_case(1, 200, 200, 1000, true);
        gemm_case(2, 300, 130, 40, true);
        gemm_case(2, 137, 264, 1000, false);
        ws_blocks = 1;
        gemm_case(1, 300, 520, 136, false);
        ws_blocks = 3;
        for (const EpCase& e : EPI_CASES) epi_case(e);
        ws_bn = 256;
        for (unsigned b : {3u, 7u}) {
            ws_blocks = b;
            gemm_case(1, 300, 600, 136, true);
            gemm_case(2, 200, 264, 40, false);
        }
        ws_blocks = 3;
        gemm_case(2, 137, 520, 480, true);
        for (const EpCase& e : EPI_CASES)
            if (mmtest::k_slices(e.kind == EPI_SILU ? (e.n0 + 31) / 32 * 64 : e.kind == EPI_RESID ? e.n0 : e.n0 + 2 * e.n1, e.k).count == 1) epi_case(e);
        std::printf("sm90: %d checks, %d failed\n", checks, failures);
        return failures == 0 ? 0 : 1;
    }
    // Breaks 6-8 are in the fused epilogues: the cases of the epilogues each reaches, every one
    // of which must catch it. The others: plain GEMMs with more k tiles than stages, so that
    // every stage is refilled (break 2 needs it).
    if (wgmma_break == 10 || wgmma_break == 11) {
        // The persistent kernels' hooks: 10 the 128 x 256 tiles (plain and staged epilogues),
        // 11 either width over several tiles a block.
        ws_bn = 256;
        in_child("matmul_wgmma_ws256 m=300 n=600 k=136", [&] { gemm_case(1, 300, 600, 136, true); });
        in_child("matmul_wgmma_ws256 EPI_SILU m=137 k=136", [&] { epi_case(EpCase{EPI_SILU, 2, 137, 160, 0, 136, false, 0, true}); });
        in_child("matmul_wgmma_ws256 EPI_QKV_ROPE m=300 k=136", [&] { epi_case(EpCase{EPI_QKV_ROPE, 2, 300, 512, 128, 136, true, 128}); });
        if (wgmma_break == 11) {
            ws_bn = 128;
            in_child("matmul_wgmma_ws m=200 n=200 k=1000", [&] { gemm_case(1, 200, 200, 1000, true); });
            in_child("matmul_wgmma_ws EPI_RESID m=200 k=1000", [&] { epi_case(EpCase{EPI_RESID, 1, 200, 200, 0, 1000, false}); });
        }
    } else if (wgmma_break >= 6 && wgmma_break <= 8) {
        for (const EpCase& e : EPI_CASES) {
            const bool reach = wgmma_break == 8 || e.kind == EPI_QKV_ROPE || (wgmma_break == 7 && e.kind == EPI_SILU);
            if (!reach || (wgmma_break == 6 && !e.bias)) continue;
            in_child(std::string("matmul_wgmma ") + epi_name(e.kind) + " m=" + std::to_string(e.m) + " k=" + std::to_string(e.k), [&] { epi_case(e); });
        }
    } else {
        for (auto [dt, m, n, k] : {std::tuple{1, 200, 200, 1000}, std::tuple{2, 137, 264, 1000}, std::tuple{1, 300, 72, 520}})
            in_child("matmul_wgmma m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k), [&] { gemm_case(dt, m, n, k, true); });
    }
    std::printf("TANDEM_WGMMA_BREAK=%d: %d of %d checks caught the break\n", wgmma_break, failures, checks);
    return failures == checks ? 0 : 1;
}
