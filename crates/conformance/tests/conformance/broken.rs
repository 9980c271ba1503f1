//! The suite must be able to fail. A wrapper around the reference backend injects one fault at
//! a time (the bugs GPU kernels really have: a dropped K tail, an off-by-one causal mask, a
//! skipped token, an unwritten element, a write past the end) and the suite must report every
//! case of the faulty op as FAIL, and every case of the other ops as ok.

use tandem_conformance::{cases, run, CaseResult};
use tandem_core::backend::{
    AttnArgs, Backend, DType, Device, FusedOps, KvDtype, KvGeometry, MoeExpert, Ops, Sampling, Storage,
};
use tandem_core::weights::TensorView;
use tandem_core::{Error, Result};
use tandem_reference::RefBackend;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// rms_norm output scaled by (1 + 1e-3), as with a wrong eps or a half-precision sum.
    RmsNormScaled,
    /// rms_norm leaves the last element of its output unwritten.
    RmsNormSkipsLast,
    /// matmul ignores the last column of k (a tile loop that drops the remainder).
    MatmulDropsKTail,
    /// matmul writes one row too few.
    MatmulSkipsLastRow,
    /// paged attention masks with `<` instead of `<=`: a token does not see itself.
    AttentionExcludesSelf,
    /// paged attention reads the cache as if blocks were contiguous (ignores the block table).
    AttentionIgnoresBlockTable,
    /// paged attention ignores its sliding window (attends to the whole context).
    AttentionIgnoresWindow,
    /// paged attention's window one key too wide (`j >= p - w` instead of `j > p - w`).
    AttentionWindowOneWide,
    /// kv_write drops the last token.
    KvWriteSkipsLastToken,
    /// kv_write stores K into the V cache too.
    KvWriteVFromK,
    /// silu_mul writes one element past its length.
    SiluMulWritesPastEnd,
    /// add returns an error.
    AddErrors,
    /// argmax returns the highest index on ties.
    ArgmaxLastOnTie,
    /// rope panics.
    RopePanics,
    /// No fault: a routed mixture of experts (moe_prepare gives a table) computed on the host
    /// as the every-expert path does, so the moe_routed cases run and must pass.
    MoeRoutedExact,
    /// The routed mixture of experts leaves out each token's last expert.
    MoeRoutedDropsLast,
}

struct Faulty<B: Backend> {
    inner: B,
    fault: Fault,
}

impl<B: Backend> Faulty<B> {
    /// Reads `len` f32 values, lets `f` change them, writes them back.
    fn patch(&self, buf: &mut B::Buf, len: usize, f: impl FnOnce(&mut Vec<f32>)) -> Result<()> {
        let mut v = self.inner.read_f32(buf, len)?;
        f(&mut v);
        self.inner.write_f32(buf, &v)
    }
    fn f32_buf(&self, v: &[f32]) -> Result<B::Buf> {
        let mut b = self.inner.alloc_f32(v.len())?;
        self.inner.write_f32(&mut b, v)?;
        Ok(b)
    }
    fn u32_buf(&self, v: &[u32]) -> Result<B::Buf> {
        let mut b = self.inner.alloc_u32(v.len())?;
        self.inner.write_u32(&mut b, v)?;
        Ok(b)
    }
}

impl<B: Backend> Device for Faulty<B> {
    fn name(&self) -> &'static str {
        "faulty"
    }
}

impl<B: Backend> Storage for Faulty<B> {
    type Buf = B::Buf;
    fn upload_weight(&self, t: &TensorView) -> Result<B::Buf> {
        self.inner.upload_weight(t)
    }
    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<B::Buf> {
        self.inner.weight_from_f32(dtype, values)
    }
    fn alloc_f32(&self, len: usize) -> Result<B::Buf> {
        self.inner.alloc_f32(len)
    }
    fn alloc_u32(&self, len: usize) -> Result<B::Buf> {
        self.inner.alloc_u32(len)
    }
    fn alloc_kv(&self, g: KvGeometry) -> Result<B::Buf> {
        self.inner.alloc_kv(g)
    }
    fn kv_dtypes(&self) -> &'static [KvDtype] {
        self.inner.kv_dtypes()
    }
    fn alloc_kv_as(&self, g: KvGeometry, dtype: KvDtype) -> Result<B::Buf> {
        self.inner.alloc_kv_as(g, dtype)
    }
    fn write_f32(&self, buf: &mut B::Buf, data: &[f32]) -> Result<()> {
        self.inner.write_f32(buf, data)
    }
    fn write_u32(&self, buf: &mut B::Buf, data: &[u32]) -> Result<()> {
        self.inner.write_u32(buf, data)
    }
    fn read_f32(&self, buf: &B::Buf, len: usize) -> Result<Vec<f32>> {
        self.inner.read_f32(buf, len)
    }
    fn read_u32(&self, buf: &B::Buf, len: usize) -> Result<Vec<u32>> {
        self.inner.read_u32(buf, len)
    }
    fn read_kv(&self, buf: &B::Buf, g: KvGeometry) -> Result<Vec<f32>> {
        self.inner.read_kv(buf, g)
    }
}

impl<B: Backend> Ops for Faulty<B> {
    fn embedding(&self, table: &B::Buf, ids: &B::Buf, out: &mut B::Buf, t: usize, hidden: usize) -> Result<()> {
        self.inner.embedding(table, ids, out, t, hidden)
    }
    fn gather_rows(&self, src: &B::Buf, rows: &B::Buf, out: &mut B::Buf, n: usize, dim: usize) -> Result<()> {
        self.inner.gather_rows(src, rows, out, n, dim)
    }
    fn rms_norm(&self, x: &B::Buf, w: &B::Buf, out: &mut B::Buf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        let len = rows * dim;
        match self.fault {
            Fault::RmsNormScaled => {
                self.inner.rms_norm(x, w, out, rows, dim, eps)?;
                self.patch(out, len, |v| v.iter_mut().for_each(|x| *x *= 1.001))
            }
            Fault::RmsNormSkipsLast => {
                let before = self.inner.read_f32(out, len)?;
                self.inner.rms_norm(x, w, out, rows, dim, eps)?;
                self.patch(out, len, |v| v[len - 1] = before[len - 1])
            }
            _ => self.inner.rms_norm(x, w, out, rows, dim, eps),
        }
    }
    fn add(&self, acc: &mut B::Buf, x: &B::Buf, len: usize) -> Result<()> {
        if self.fault == Fault::AddErrors {
            return Err(Error::backend("faulty", "add: injected error"));
        }
        self.inner.add(acc, x, len)
    }
    fn matmul(
        &self,
        x: &B::Buf,
        w: &B::Buf,
        bias: Option<&B::Buf>,
        out: &mut B::Buf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        match self.fault {
            Fault::MatmulDropsKTail => {
                let mut xs = self.inner.read_f32(x, m * k)?;
                for row in xs.chunks_exact_mut(k) {
                    row[k - 1] = 0.0;
                }
                let x2 = self.f32_buf(&xs)?;
                self.inner.matmul(&x2, w, bias, out, m, n, k)
            }
            Fault::MatmulSkipsLastRow => {
                let before = self.inner.read_f32(out, m * n)?;
                self.inner.matmul(x, w, bias, out, m, n, k)?;
                self.patch(out, m * n, |v| v[(m - 1) * n..].copy_from_slice(&before[(m - 1) * n..]))
            }
            _ => self.inner.matmul(x, w, bias, out, m, n, k),
        }
    }
    fn rope(
        &self,
        q: &mut B::Buf,
        k: &mut B::Buf,
        pos: &B::Buf,
        inv_freq: &B::Buf,
        t: usize,
        qh: usize,
        kh: usize,
        hd: usize,
    ) -> Result<()> {
        if self.fault == Fault::RopePanics {
            panic!("rope: injected panic");
        }
        self.inner.rope(q, k, pos, inv_freq, t, qh, kh, hd)
    }
    fn silu_mul(&self, gate: &B::Buf, up: &B::Buf, out: &mut B::Buf, len: usize) -> Result<()> {
        self.inner.silu_mul(gate, up, out, len)?;
        if self.fault == Fault::SiluMulWritesPastEnd {
            self.patch(out, len + 1, |v| v[len] = 0.0)?;
        }
        Ok(())
    }
    fn gelu_tanh_mul(&self, gate: &B::Buf, up: &B::Buf, out: &mut B::Buf, len: usize) -> Result<()> {
        self.inner.gelu_tanh_mul(gate, up, out, len)
    }
    fn scale(&self, x: &mut B::Buf, factor: f32, len: usize) -> Result<()> {
        self.inner.scale(x, factor, len)
    }
    fn kv_write(
        &self,
        k: &B::Buf,
        v: &B::Buf,
        kc: &mut B::Buf,
        vc: &mut B::Buf,
        slots: &B::Buf,
        t: usize,
        g: KvGeometry,
    ) -> Result<()> {
        match self.fault {
            Fault::KvWriteSkipsLastToken => self.inner.kv_write(k, v, kc, vc, slots, t - 1, g),
            Fault::KvWriteVFromK => self.inner.kv_write(k, k, kc, vc, slots, t, g),
            _ => self.inner.kv_write(k, v, kc, vc, slots, t, g),
        }
    }
    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut B::Buf) -> Result<()> {
        let mut positions = self.inner.read_u32(a.positions, a.num_tokens)?;
        let mut tables = self.inner.read_u32(a.block_tables, a.num_seqs * a.max_blocks)?;
        match self.fault {
            Fault::AttentionExcludesSelf => positions.iter_mut().for_each(|p| *p = p.saturating_sub(1)),
            Fault::AttentionIgnoresBlockTable => {
                // Sequence s is assumed to own blocks s*max_blocks.., wrapped into the cache.
                let nb = a.geometry.num_blocks as u32;
                for (i, b) in tables.iter_mut().enumerate() {
                    *b = i as u32 % nb;
                }
            }
            _ => {}
        }
        let (positions, tables) = (self.u32_buf(&positions)?, self.u32_buf(&tables)?);
        let args = AttnArgs::<B> {
            q: a.q,
            k_cache: a.k_cache,
            v_cache: a.v_cache,
            positions: &positions,
            token_seq: a.token_seq,
            block_tables: &tables,
            num_tokens: a.num_tokens,
            num_seqs: a.num_seqs,
            max_blocks: a.max_blocks,
            max_context: a.max_context,
            decode_tokens: a.decode_tokens,
            num_heads: a.num_heads,
            geometry: a.geometry,
            scale: a.scale,
            window: match self.fault {
                Fault::AttentionIgnoresWindow => 0,
                Fault::AttentionWindowOneWide if a.window > 0 => a.window + 1,
                _ => a.window,
            },
        };
        self.inner.paged_attention(&args, out)
    }
}

impl<B: Backend> FusedOps for Faulty<B> {
    fn moe_prepare(&self, experts: &[MoeExpert<'_, B::Buf>], hidden: usize, inter: usize) -> Result<Option<B::Buf>> {
        match self.fault {
            Fault::MoeRoutedExact | Fault::MoeRoutedDropsLast => Ok(Some(self.inner.alloc_u32(1)?)),
            _ => self.inner.moe_prepare(experts, hidden, inter),
        }
    }
    /// Every expert over every token with the routing weights (the last non-zero one of each
    /// row zeroed for MoeRoutedDropsLast), as layers::Moe runs them.
    fn moe_routed(
        &self,
        _table: &B::Buf,
        experts: &[MoeExpert<'_, B::Buf>],
        x: &B::Buf,
        weights: &B::Buf,
        out: &mut B::Buf,
        rows: usize,
        hidden: usize,
        inter: usize,
        _top_k: usize,
    ) -> Result<()> {
        let ne = experts.len();
        let mut w = self.inner.read_f32(weights, rows * ne)?;
        if self.fault == Fault::MoeRoutedDropsLast {
            for row in w.chunks_exact_mut(ne) {
                if let Some(j) = row.iter().rposition(|&v| v != 0.0) {
                    row[j] = 0.0;
                }
            }
        }
        let wb = self.f32_buf(&w)?;
        let (mut g, mut u, mut act, mut y) = (
            self.inner.alloc_f32(rows * inter)?,
            self.inner.alloc_f32(rows * inter)?,
            self.inner.alloc_f32(rows * inter)?,
            self.inner.alloc_f32(rows * hidden)?,
        );
        for (e, ex) in experts.iter().enumerate() {
            let up =
                ex.up.ok_or_else(|| Error::backend("faulty", "moe_routed: the reference keeps gate and up apart"))?;
            self.inner.matmul(x, ex.gate, None, &mut g, rows, inter, hidden)?;
            self.inner.matmul(x, up, None, &mut u, rows, inter, hidden)?;
            self.inner.silu_mul(&g, &u, &mut act, rows * inter)?;
            self.inner.matmul(&act, ex.down, None, &mut y, rows, hidden, inter)?;
            self.inner.moe_accumulate(out, &y, &wb, rows, hidden, e, ne, e == 0)?;
        }
        Ok(())
    }
}

impl<B: Backend> Sampling for Faulty<B> {
    fn argmax(&self, logits: &B::Buf, rows: usize, vocab: usize) -> Result<Vec<u32>> {
        let ids = self.inner.argmax(logits, rows, vocab)?;
        if self.fault != Fault::ArgmaxLastOnTie {
            return Ok(ids);
        }
        let v = self.inner.read_f32(logits, rows * vocab)?;
        Ok(v.chunks_exact(vocab)
            .zip(ids)
            .map(|(row, id)| (0..vocab).rev().find(|&j| row[j] == row[id as usize]).unwrap_or(0) as u32)
            .collect())
    }
}

fn faulty_op(fault: Fault) -> &'static str {
    match fault {
        Fault::RmsNormScaled | Fault::RmsNormSkipsLast => "rms_norm",
        Fault::MatmulDropsKTail | Fault::MatmulSkipsLastRow => "matmul",
        Fault::AttentionExcludesSelf
        | Fault::AttentionIgnoresBlockTable
        | Fault::AttentionIgnoresWindow
        | Fault::AttentionWindowOneWide => "paged_attention",
        Fault::KvWriteSkipsLastToken | Fault::KvWriteVFromK => "kv_write",
        Fault::SiluMulWritesPastEnd => "silu_mul",
        Fault::AddErrors => "add",
        Fault::ArgmaxLastOnTie => "argmax",
        Fault::RopePanics => "rope",
        Fault::MoeRoutedExact | Fault::MoeRoutedDropsLast => "moe_routed",
    }
}

/// Runs the suite (the cases `filter` selects) with `fault`; checks the report's counts and
/// last line, and returns the results and the printed text.
fn run_with(fault: Fault, filter: Option<&str>) -> (Vec<CaseResult>, String) {
    let b = Faulty { inner: RefBackend::new(), fault };
    let mut out = Vec::new();
    let rep = run(&b, filter, 99, &mut out);
    let text = String::from_utf8(out).unwrap();
    let selected = tandem_conformance::selected(filter).len();
    assert!(selected > 0);
    assert_eq!(rep.passed + rep.failed + rep.skipped_cases, selected);
    assert_eq!(rep.results.len(), selected);
    assert!(!rep.ok());
    let skipped = if rep.skipped_cases > 0 { format!(", {} skipped", rep.skipped_cases) } else { String::new() };
    assert_eq!(text.lines().last().unwrap(), format!("faulty: {} passed, {} failed{skipped}", rep.passed, rep.failed));
    (rep.results, text)
}

/// Every case of the faulty op fails, with `why` in its message and FAIL on its line.
fn assert_caught(fault: Fault, why: &str) {
    let op = faulty_op(fault);
    let (results, text) = run_with(fault, Some(op));
    for r in &results {
        let msg = r.failure.as_deref().unwrap_or_else(|| panic!("{fault:?}: case `{op} {}` passed\n{text}", r.params));
        assert!(msg.contains(why), "{fault:?}: `{op} {}` failed for another reason: {msg}", r.params);
        // The filter also selects ops whose name contains `op` (add_rms_norm for rms_norm).
        let line = text.lines().find(|l| l.starts_with(r.op) && l.contains(&r.params)).unwrap();
        assert!(line.contains("FAIL") && line.contains(&format!("case seed {}", r.seed)), "{line}");
    }
}

#[test]
fn a_fault_in_one_op_fails_that_op_only() {
    // Attention and the fused attention-input ops fill their cache through kv_write, and this
    // wrapper's fused ops are the trait's defaults (add_rms_norm: add, then rms_norm;
    // rope_kv_write and qkv_rope_kv_write end in kv_write; residual_norm_gate_up runs
    // add_rms_norm where the backend does not fuse norms), so those faults reach them too;
    // every other op is independent of every other.
    let kv_downstream = &["paged_attention", "rope_kv_write", "qkv_rope_kv_write"][..];
    for (fault, downstream) in
        [(Fault::RmsNormScaled, &["add_rms_norm", "residual_norm_gate_up"][..]), (Fault::KvWriteVFromK, kv_downstream)]
    {
        let op = faulty_op(fault);
        let (results, _) = run_with(fault, None);
        assert_eq!(results.len(), cases().len());
        for r in &results {
            if r.op == op {
                assert!(!r.passed(), "{fault:?}: `{} {}` passed", r.op, r.params);
            } else if !downstream.contains(&r.op) {
                assert!(r.passed(), "{fault:?} broke `{} {}` too: {:?}", r.op, r.params, r.failure);
            }
        }
    }
}

#[test]
fn rms_norm_slightly_off_is_caught_by_nmse() {
    assert_caught(Fault::RmsNormScaled, "nmse");
}

#[test]
fn rms_norm_unwritten_element_is_caught_by_the_poison() {
    assert_caught(Fault::RmsNormSkipsLast, "non-finite");
}

#[test]
fn matmul_dropping_the_k_tail_is_caught() {
    assert_caught(Fault::MatmulDropsKTail, "nmse");
}

#[test]
fn matmul_skipping_a_row_is_caught_by_the_poison() {
    assert_caught(Fault::MatmulSkipsLastRow, "non-finite");
}

#[test]
fn attention_off_by_one_causal_mask_is_caught() {
    assert_caught(Fault::AttentionExcludesSelf, "nmse");
}

/// A window fault changes only the windowed attention cases: each of them fails, every
/// other attention case passes.
#[test]
fn attention_window_faults_are_caught_by_every_windowed_case() {
    for fault in [Fault::AttentionIgnoresWindow, Fault::AttentionWindowOneWide] {
        let (results, text) = run_with(fault, Some("paged_attention"));
        let windowed = results.iter().filter(|r| r.params.contains("window=")).count();
        assert!(windowed >= 4, "{fault:?}: {windowed} windowed cases\n{text}");
        for r in &results {
            match (r.params.contains("window="), r.failure.as_deref()) {
                (true, Some(msg)) => {
                    assert!(msg.contains("nmse"), "{fault:?}: `{}` failed for another reason: {msg}", r.params)
                }
                (true, None) => panic!("{fault:?}: windowed case `{}` passed\n{text}", r.params),
                (false, Some(msg)) => panic!("{fault:?}: case `{}` without a window failed: {msg}", r.params),
                (false, None) => {}
            }
        }
    }
}

#[test]
fn attention_ignoring_the_block_table_is_caught() {
    assert_caught(Fault::AttentionIgnoresBlockTable, "nmse");
}

#[test]
fn kv_write_dropping_a_token_is_caught_by_the_poison() {
    assert_caught(Fault::KvWriteSkipsLastToken, "k_cache[slots]: ");
}

#[test]
fn kv_write_storing_k_as_v_is_caught() {
    assert_caught(Fault::KvWriteVFromK, "v_cache[slots]: nmse");
}

#[test]
fn writing_past_the_end_is_caught_by_the_guard() {
    assert_caught(Fault::SiluMulWritesPastEnd, "wrote past");
}

#[test]
fn a_backend_error_fails_its_case() {
    assert_caught(Fault::AddErrors, "injected error");
}

#[test]
fn a_backend_panic_fails_its_case_and_the_suite_goes_on() {
    assert_caught(Fault::RopePanics, "panicked: rope: injected panic");
}

#[test]
fn argmax_breaking_ties_wrongly_is_caught_only_where_there_are_ties() {
    let (results, text) = run_with(Fault::ArgmaxLastOnTie, Some("argmax"));
    for r in &results {
        let tied = r.params.contains("ties=yes");
        assert_eq!(r.passed(), !tied, "argmax {}: {:?}\n{text}", r.params, r.failure);
        if tied {
            assert!(r.failure.as_deref().unwrap().contains("indices differ"));
        }
    }
}

/// With a routed path the moe_routed cases run (none skipped) and pass when its bits are the
/// every-expert path's; a routed path that leaves out an expert fails every one of them, by the
/// in-backend bitwise comparison.
#[test]
fn moe_routed_runs_where_a_backend_routes_and_a_dropped_expert_is_caught() {
    let b = Faulty { inner: RefBackend::new(), fault: Fault::MoeRoutedExact };
    let mut out = Vec::new();
    let rep = run(&b, Some("moe_routed"), 3, &mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(rep.ok() && rep.skipped_cases == 0 && rep.passed >= 4, "{text}");
    assert_caught(Fault::MoeRoutedDropsLast, "differ from the every-expert path's bits");
}
