//! The CPU performance model of the CUDA kernels (`cargo xtask kernels --predict`): for one
//! launch, a predicted time on the H200 and the term that bounds it. A tool for deciding which
//! variant to time next, never a measurement: nothing it prints goes into docs/gpu/latest.json.
//!
//! Terms (each in microseconds; the launch costs `launch_us` and the fetch of its code plus the
//! largest of the others):
//! - fetch: the kernel's machine code (its cubin's `.text` bytes, perf_code.rs) over the rate
//!   an SM's instruction fetch brings it from L2 (`fetch_gbs`); every SM pays it on every
//!   launch, and more warps do not hide it;
//! - DRAM: bytes that must come from or go to HBM over the measured copy bandwidth;
//! - tensor: tensor-core FLOPs (padded tiles) over the pipe's peak (mma.sync or wgmma);
//! - issue: instructions (mma count x instructions per mma, from SASS or ncu counters) over
//!   the SM's issue rate, which falls below 4 a cycle when too few warps hide the latency of
//!   dependent instructions (`issue_cycles` cycles a warp between issues), in waves over 132
//!   SMs at the occupancy registers and shared memory allow; plus each mma.sync's hold on its
//!   warp (`mma_cycles`, the tensor pipe's latency, over the SM's warps that hide it); plus,
//!   per wave, the first stage's arrival before anything issues, and the split-K fold after;
//! - L2: the bytes the blocks' tiles load (each block reads its rows of x and its columns of
//!   w for its whole K range, so an operand is read once per tile across), over `l2_gbs`;
//! - latency: each block's chain of dependent memory round trips (pipeline refills), each
//!   `mem_latency_us`, plus the split-K fold's rounds (the last block of a tile adds every
//!   other slice's partial tile in order, a dependent L2 round each), `fold_round_us` each;
//!   and no shorter than the longest block (a causal prefill's last rows).
//!
//! The per-variant inputs (tile, threads, registers, shared memory, stages, instructions per
//! mma, code bytes) are static facts from ptxas, the cubin, the SASS or counters; only the eight
//! [`Params`] are fitted, on timings of other variants (calibration.rs, leave-one-variant-out).

/// The machine: NVIDIA H200 (sm_90), with the figures measured on it (gpu/ceilings.py,
/// 2026-12-04: copy 4234.8 GB/s, cuBLAS bf16 769.4 TFLOP/s; ncu: SM clock 1.76 GHz).
pub struct Hw {
    pub sms: usize,
    pub clock_ghz: f64,
    pub copy_gbs: f64,
    /// Dense bf16 peak of wgmma (cuBLAS' measured rate) and of mma.sync (assumed 62% of it:
    /// mma.sync cannot feed Hopper's tensor cores at full rate).
    pub wgmma_tflops: f64,
    pub mma_sync_tflops: f64,
    pub regs_per_sm: usize,
    pub smem_per_sm: usize,
    pub max_warps_per_sm: usize,
    pub max_blocks_per_sm: usize,
}

pub const H200: Hw = Hw {
    sms: 132,
    clock_ghz: 1.76,
    copy_gbs: 4234.8,
    wgmma_tflops: 769.4,
    mma_sync_tflops: 477.0,
    regs_per_sm: 65536,
    smem_per_sm: 233_472,
    max_warps_per_sm: 64,
    max_blocks_per_sm: 32,
};

/// The fitted constants: launch overhead, one dependent memory round trip under load, the
/// cycles a warp waits between two issues, the fraction of the copy bandwidth a kernel's
/// streaming reaches, the L2's bandwidth to the SMs, one round of the split-K fold, and the
/// cycles an mma.sync holds its warp beyond its issue (the tensor pipe's latency, which only
/// other warps hide: ncu measured m128_n128, half m128's instructions an mma, at 5.98 cycles
/// between a warp's issues against m128's 4.94), and the rate at which an SM fetches a
/// kernel's code (ncu on m64 at m = 64, under one wave: 45% of the cycles between a warp's
/// issues waiting for an instruction fetch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub launch_us: f64,
    pub mem_latency_us: f64,
    pub issue_cycles: f64,
    pub dram_eff: f64,
    pub l2_gbs: f64,
    pub fold_round_us: f64,
    pub mma_cycles: f64,
    pub fetch_gbs: f64,
}

/// Where the fit starts (physical priors: ~3 us a launch, ~1 us a loaded round trip, ~5 cycles
/// between a warp's issues as ncu measured on the GEMMs, 90% of copy bandwidth, ~4 TB/s of
/// L2, an L2 round trip of ~0.5 us a fold round, ~16 cycles of an HMMA's latency, code at
/// ~50 GB/s an SM).
pub const PRIOR: Params = Params {
    launch_us: 3.0,
    mem_latency_us: 1.0,
    issue_cycles: 5.0,
    dram_eff: 0.9,
    l2_gbs: 4000.0,
    fold_round_us: 0.5,
    mma_cycles: 16.0,
    fetch_gbs: 50.0,
};

/// One kernel's static facts.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub name: &'static str,
    pub threads: usize,
    /// Registers per thread (ptxas -v, sm_90).
    pub regs: usize,
    /// Dynamic + static shared memory per block, bytes.
    pub smem: usize,
    /// Memory stages in flight per block (k tiles, key sub-tiles, chunks).
    pub stages: usize,
    /// SASS instructions issued per tensor-core instruction (or, for SIMT kernels, per
    /// element-step the builder counts), and where the figure comes from.
    pub ipm: f64,
    pub ipm_source: &'static str,
    pub wgmma: bool,
    /// Its counted steps are mma.sync tensor-core instructions, each holding its warp
    /// [`Params::mma_cycles`] (false: SIMT steps, or wgmma's asynchronous instructions).
    pub mma_sync: bool,
}

/// One launch as the model sees it.
#[derive(Clone, Debug)]
pub struct Launch {
    pub kernel: Kernel,
    pub blocks: usize,
    /// Tensor-core instructions (m16n8k16 equivalents) or counted steps per block.
    pub mmas_per_block: f64,
    /// Dependent memory round trips of one block.
    pub trips_per_block: f64,
    /// Rounds of the split-K fold on the critical path (0 without a split).
    pub fold_rounds: f64,
    /// The longest block's work over the average block's (1: uniform blocks).
    pub longest: f64,
    pub dram_bytes: f64,
    pub l2_bytes: f64,
    pub tensor_flops: f64,
    /// Launches this op takes (multi-launch samplers, argmax folds).
    pub launches: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Launch,
    Fetch,
    Dram,
    L2,
    Tensor,
    Issue,
    Latency,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Launch => "launch",
            Bound::Fetch => "fetch",
            Bound::Dram => "dram",
            Bound::L2 => "l2",
            Bound::Tensor => "tensor",
            Bound::Issue => "issue",
            Bound::Latency => "latency",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Prediction {
    pub us: f64,
    pub bound: Bound,
    pub launch_us: f64,
    pub fetch_us: f64,
    pub dram_us: f64,
    pub l2_us: f64,
    pub tensor_us: f64,
    pub issue_us: f64,
    pub latency_us: f64,
    pub blocks_per_sm: usize,
    pub waves: usize,
}

/// Blocks of `k` one SM holds: registers (allocated per warp in units of 256), shared memory
/// (plus 1 KiB reserved a block), warps and the block limit.
pub fn blocks_per_sm(k: &Kernel, hw: &Hw) -> usize {
    let warps = k.threads.div_ceil(32);
    let regs_per_warp = (k.regs.max(1) * 32).div_ceil(256) * 256;
    let by_regs = hw.regs_per_sm / (regs_per_warp * warps).max(1);
    let by_smem = if k.smem == 0 { hw.max_blocks_per_sm } else { hw.smem_per_sm / (k.smem + 1024) };
    let by_warps = hw.max_warps_per_sm / warps.max(1);
    by_regs.min(by_smem).min(by_warps).min(hw.max_blocks_per_sm)
}

/// Full waves of `blocks` over the machine at `per_sm` blocks an SM.
pub fn waves(blocks: usize, per_sm: usize, hw: &Hw) -> usize {
    blocks.div_ceil((hw.sms * per_sm).max(1)).max(1)
}

/// Time of a roofline bound: `amount` at `rate` (bytes/GB/s or flops/TFLOP/s), in us.
pub fn roofline_us(amount: f64, rate_per_us: f64) -> f64 {
    if rate_per_us <= 0.0 {
        return f64::INFINITY;
    }
    amount / rate_per_us
}

pub fn predict(l: &Launch, hw: &Hw, p: &Params) -> Prediction {
    let k = &l.kernel;
    let per_sm = blocks_per_sm(k, hw).max(1);
    let w = waves(l.blocks, per_sm, hw);
    // Blocks sharing one busy SM in a wave.
    let resident = per_sm.min(l.blocks.div_ceil(hw.sms)).max(1);
    let warps_sm = (resident * k.threads.div_ceil(32)) as f64;
    let ipc = (warps_sm / p.issue_cycles).min(4.0);
    // Each mma.sync also holds its warp `mma_cycles`: the SM's warps wait on the tensor pipe in
    // parallel, so the hold costs the SM mma_cycles / warps an mma (few warps: a large share).
    let hold = if k.mma_sync { p.mma_cycles / warps_sm } else { 0.0 };
    let issue_cycles = resident as f64 * l.mmas_per_block * (k.ipm / ipc + hold);
    let block_us = issue_cycles / (hw.clock_ghz * 1e3);
    // Issuing cannot start before a wave's first stage arrives, and the fold follows it.
    let issue_us = if l.mmas_per_block > 0.0 {
        (w as f64 * block_us).max(block_us * l.longest) + w as f64 * p.mem_latency_us + l.fold_rounds * p.fold_round_us
    } else {
        0.0
    };
    let chain_us = l.trips_per_block * p.mem_latency_us;
    let latency_us = (w as f64 * chain_us).max(chain_us * l.longest) + l.fold_rounds * p.fold_round_us;
    let dram_us = roofline_us(l.dram_bytes, hw.copy_gbs * 1e3 * p.dram_eff);
    let l2_us = roofline_us(l.l2_bytes, p.l2_gbs * 1e3);
    let peak = if k.wgmma { hw.wgmma_tflops } else { hw.mma_sync_tflops };
    let tensor_us = roofline_us(l.tensor_flops, peak * 1e6);
    let launch_us = p.launch_us * l.launches.max(1) as f64;
    // The kernel's code, fetched cold by every SM before and while its blocks run: a serial
    // cost of each launch, like the launch itself.
    let fetch_us = crate::perf_code::text_bytes(k.name).unwrap_or(0.0) / (p.fetch_gbs * 1e3);
    let terms = [
        (Bound::Dram, dram_us),
        (Bound::L2, l2_us),
        (Bound::Tensor, tensor_us),
        (Bound::Issue, issue_us),
        (Bound::Latency, latency_us),
    ];
    let (mut bound, mut top) = (Bound::Launch, 0.0);
    for (b, t) in terms {
        if t > top {
            (bound, top) = (b, t);
        }
    }
    if launch_us + fetch_us > top {
        bound = if fetch_us > launch_us { Bound::Fetch } else { Bound::Launch };
    }
    Prediction {
        us: launch_us + fetch_us + top,
        bound,
        launch_us,
        fetch_us,
        dram_us,
        l2_us,
        tensor_us,
        issue_us,
        latency_us,
        blocks_per_sm: per_sm,
        waves: w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(threads: usize, regs: usize, smem: usize) -> Kernel {
        Kernel {
            name: "t",
            threads,
            regs,
            smem,
            stages: 4,
            ipm: 10.0,
            ipm_source: "test",
            wgmma: false,
            mma_sync: false,
        }
    }

    /// ncu's occupancy figures of 2026-12-04: m128 (256 threads, 158 regs, 46 KB) 1 block an
    /// SM; m64 (128 threads, 160 regs, 41 KB) 3; tc_d64 attention (128, 168, 18 KB) 3.
    #[test]
    fn occupancy_matches_ncu_block_limits() {
        assert_eq!(blocks_per_sm(&kernel(256, 158, 46080), &H200), 1);
        assert_eq!(blocks_per_sm(&kernel(128, 160, 40960), &H200), 3);
        assert_eq!(blocks_per_sm(&kernel(128, 168, 18432), &H200), 3);
        assert_eq!(blocks_per_sm(&kernel(256, 164, 147_456), &H200), 1);
        assert_eq!(blocks_per_sm(&kernel(64, 32, 0), &H200), 32);
    }

    /// ncu's "Waves Per SM": m128 at 768 blocks, one an SM, is 5.82 waves (6 whole ones).
    #[test]
    fn waves_round_up_over_132_sms() {
        assert_eq!(waves(768, 1, &H200), 6);
        assert_eq!(waves(132, 1, &H200), 1);
        assert_eq!(waves(133, 1, &H200), 2);
        assert_eq!(waves(32, 3, &H200), 1);
        assert_eq!(waves(0, 3, &H200), 1);
    }

    #[test]
    fn roofline_takes_the_larger_bound_plus_the_launch() {
        let p = Params {
            launch_us: 2.0,
            mem_latency_us: 0.0,
            issue_cycles: 1.0,
            dram_eff: 1.0,
            l2_gbs: 8469.6,
            fold_round_us: 0.0,
            mma_cycles: 0.0,
            fetch_gbs: f64::INFINITY,
        };
        // 42.348 MB at 4234.8 GB/s: 10 us of DRAM; no instructions.
        let l = Launch {
            kernel: Kernel { ipm: 0.0, ..kernel(128, 32, 0) },
            blocks: 132,
            mmas_per_block: 0.0,
            trips_per_block: 0.0,
            fold_rounds: 0.0,
            longest: 1.0,
            dram_bytes: 42.348e6,
            l2_bytes: 42.348e6,
            tensor_flops: 477e6,
            launches: 1,
        };
        let r = predict(&l, &H200, &p);
        assert!((r.dram_us - 10.0).abs() < 1e-9 && (r.tensor_us - 1.0).abs() < 1e-9 && (r.l2_us - 5.0).abs() < 1e-9);
        assert_eq!(r.bound, Bound::Dram);
        assert!((r.us - 12.0).abs() < 1e-9);
        // An empty launch is launch-bound.
        let r = predict(&Launch { dram_bytes: 0.0, l2_bytes: 0.0, tensor_flops: 0.0, ..l }, &H200, &p);
        assert_eq!((r.bound, r.us), (Bound::Launch, 2.0));
    }

    /// Issue: 8 warps an SM at 5 cycles between a warp's issues give 1.6 instructions a cycle
    /// (ncu measured 1.62 on m128); 40 warps saturate at 4.
    #[test]
    fn issue_rate_follows_warps_until_four_a_cycle() {
        let p = Params {
            launch_us: 0.0,
            mem_latency_us: 0.0,
            issue_cycles: 5.0,
            dram_eff: 1.0,
            l2_gbs: 1e9,
            fold_round_us: 0.0,
            mma_cycles: 0.0,
            fetch_gbs: f64::INFINITY,
        };
        let l = Launch {
            kernel: Kernel { ipm: 1.0, ..kernel(256, 158, 46080) },
            blocks: 132,
            mmas_per_block: 1.6 * 1760.0,
            trips_per_block: 0.0,
            fold_rounds: 0.0,
            longest: 1.0,
            dram_bytes: 0.0,
            l2_bytes: 0.0,
            tensor_flops: 0.0,
            launches: 1,
        };
        let r = predict(&l, &H200, &p);
        assert!((r.issue_us - 1.0).abs() < 1e-9, "{r:?}");
        let wide = Launch {
            kernel: Kernel { ipm: 1.0, ..kernel(1024, 32, 0) },
            blocks: 264,
            mmas_per_block: 4.0 * 1760.0,
            ..l
        };
        let r = predict(&wide, &H200, &p);
        assert!((r.issue_us - 2.0).abs() < 1e-9, "two resident blocks of 32 warps: {r:?}");
        // A block three times the average sets the time of a single wave.
        let skewed = Launch { longest: 3.0, ..l };
        assert!((predict(&skewed, &H200, &p).issue_us - 3.0).abs() < 1e-9);
    }

    /// An mma.sync holds its warp `mma_cycles`, which the SM's other warps hide: one block of 8
    /// warps pays 16 / 8 cycles an mma, two resident blocks (16 warps) half that each, so twice
    /// the blocks take the same time; SIMT steps pay nothing.
    #[test]
    fn an_mma_hold_is_hidden_by_more_warps() {
        let p = Params {
            launch_us: 0.0,
            mem_latency_us: 0.0,
            issue_cycles: 1.0,
            dram_eff: 1.0,
            l2_gbs: 1e9,
            fold_round_us: 0.0,
            mma_cycles: 16.0,
            fetch_gbs: f64::INFINITY,
        };
        let l = Launch {
            kernel: Kernel { ipm: 0.0, mma_sync: true, ..kernel(256, 158, 46080) },
            blocks: 132,
            mmas_per_block: 1760.0,
            trips_per_block: 0.0,
            fold_rounds: 0.0,
            longest: 1.0,
            dram_bytes: 0.0,
            l2_bytes: 0.0,
            tensor_flops: 0.0,
            launches: 1,
        };
        // 1760 mmas x 16 / 8 cycles at 1.76 GHz: 2 us.
        assert!((predict(&l, &H200, &p).issue_us - 2.0).abs() < 1e-9);
        let two =
            Launch { kernel: Kernel { ipm: 0.0, mma_sync: true, ..kernel(256, 64, 0) }, blocks: 264, ..l.clone() };
        assert!((predict(&two, &H200, &p).issue_us - 2.0).abs() < 1e-9, "{:?}", predict(&two, &H200, &p));
        let simt = Launch { kernel: Kernel { mma_sync: false, ..l.kernel }, ..l };
        assert_eq!(predict(&simt, &H200, &p).issue_us, 0.0);
    }

    /// The fetch term: a kernel's code bytes over the fitted rate, paid once a launch beside
    /// the launch overhead; a kernel with no measured code pays none.
    #[test]
    fn code_fetch_is_a_serial_cost_of_the_launch() {
        let p = Params {
            launch_us: 2.0,
            mem_latency_us: 0.0,
            issue_cycles: 1.0,
            dram_eff: 1.0,
            l2_gbs: 1e9,
            fold_round_us: 0.0,
            mma_cycles: 0.0,
            fetch_gbs: 27.456,
        };
        let l = Launch {
            kernel: Kernel { name: "m16", ipm: 0.0, ..kernel(128, 80, 0) },
            blocks: 132,
            mmas_per_block: 0.0,
            trips_per_block: 0.0,
            fold_rounds: 0.0,
            longest: 1.0,
            dram_bytes: 4234.8e3,
            l2_bytes: 0.0,
            tensor_flops: 0.0,
            launches: 1,
        };
        // m16's 274,560 bytes at 27.456 GB/s: 10 us, beside 2 us of launch and 1 us of DRAM.
        let r = predict(&l, &H200, &p);
        assert!((r.fetch_us - 10.0).abs() < 1e-9 && (r.us - 13.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.bound, Bound::Fetch);
        let unknown = predict(&Launch { kernel: Kernel { name: "t", ..l.kernel }, ..l }, &H200, &p);
        assert_eq!((unknown.fetch_us, unknown.bound), (0.0, Bound::Launch));
        assert!((unknown.us - 3.0).abs() < 1e-9);
    }
}
