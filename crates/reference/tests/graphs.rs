//! Padded decode steps and graph replay, on the reference backend (no GPU needed).
//!
//! `pad_decode` pads each decode step to its batch-size bucket, as CUDA graphs need: the ids
//! and logits must be bitwise those of the unpadded step, alone and in batches, and the
//! padding rows must write no KV block the engine owns. `Replay` is a backend that records a
//! captured step's op calls (buffers by identity, scalars by value) and runs them again on
//! every replay against the buffers' current contents, as a CUDA graph does: if anything that
//! varies per step still reached an op as a host value, the replayed steps would compute
//! another step's shapes and their logits would differ from the eager model's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tandem_core::backend::{AttnArgs, GraphId, KvDtype, KvGeometry};
use tandem_core::backend::{Device, FusedOps, Ops, Sampling, Storage};
use tandem_core::model::LoadOptions;
use tandem_core::weights::TensorView;
use tandem_core::{Backend, DType, Error, ForwardBatch, Model, ModelRunner, Result};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

type Shared<T> = Arc<Mutex<T>>;
type Op<B> = Box<dyn Fn(&B) -> Result<()> + Send + Sync>;

/// A graph-capturing wrapper around a backend: see the module comment.
struct Replay<B: Backend> {
    inner: B,
    recording: Mutex<Option<Vec<Op<B>>>>,
    graphs: Mutex<Vec<Arc<Vec<Op<B>>>>>,
    replays: AtomicUsize,
    /// Fault injection: the capture that ends after this many succeeded fails; replays fail.
    fail_capture_after: Option<usize>,
    fail_replays: bool,
}

impl<B: Backend> Replay<B> {
    fn new(inner: B) -> Self {
        Replay {
            inner,
            recording: Mutex::new(None),
            graphs: Mutex::new(vec![]),
            replays: AtomicUsize::new(0),
            fail_capture_after: None,
            fail_replays: false,
        }
    }
    /// Runs `f` now, or records it while capturing.
    fn op(&self, f: impl Fn(&B) -> Result<()> + Send + Sync + 'static) -> Result<()> {
        let mut r = self.recording.lock().unwrap();
        match r.as_mut() {
            Some(ops) => {
                ops.push(Box::new(f));
                Ok(())
            }
            None => {
                drop(r);
                f(&self.inner)
            }
        }
    }
    fn no_io(&self, what: &str) -> Result<()> {
        match self.recording.lock().unwrap().is_some() {
            true => Err(Error::backend("replay", format!("{what} while capturing"))),
            false => Ok(()),
        }
    }
}

fn shared<T>(r: Result<T>) -> Result<Shared<T>> {
    r.map(|b| Arc::new(Mutex::new(b)))
}

impl<B: Backend> Device for Replay<B> {
    fn name(&self) -> &'static str {
        "replay"
    }
    fn supports_graphs(&self) -> bool {
        true
    }
    fn begin_capture(&self) -> Result<()> {
        let mut r = self.recording.lock().unwrap();
        if r.is_some() {
            return Err(Error::backend("replay", "begin_capture while capturing"));
        }
        *r = Some(vec![]);
        Ok(())
    }
    fn end_capture(&self) -> Result<GraphId> {
        let ops = self
            .recording
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| Error::backend("replay", "end_capture without begin_capture"))?;
        let mut g = self.graphs.lock().unwrap();
        if self.fail_capture_after == Some(g.len()) {
            return Err(Error::backend("replay", "injected capture failure"));
        }
        g.push(Arc::new(ops));
        Ok(GraphId(g.len() - 1))
    }
    fn replay(&self, graph: GraphId) -> Result<()> {
        self.no_io("replay")?;
        let ops = self
            .graphs
            .lock()
            .unwrap()
            .get(graph.0)
            .cloned()
            .ok_or_else(|| Error::backend("replay", format!("no graph {graph:?}")))?;
        if self.fail_replays {
            return Err(Error::backend("replay", "injected replay failure"));
        }
        self.replays.fetch_add(1, Ordering::Relaxed);
        ops.iter().try_for_each(|op| op(&self.inner))
    }
}

impl<B: Backend> Storage for Replay<B> {
    type Buf = Shared<B::Buf>;
    fn upload_weight(&self, t: &TensorView) -> Result<Self::Buf> {
        shared(self.inner.upload_weight(t))
    }
    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<Self::Buf> {
        shared(self.inner.weight_from_f32(dtype, values))
    }
    fn alloc_f32(&self, len: usize) -> Result<Self::Buf> {
        shared(self.inner.alloc_f32(len))
    }
    fn alloc_u32(&self, len: usize) -> Result<Self::Buf> {
        shared(self.inner.alloc_u32(len))
    }
    fn kv_dtypes(&self) -> &'static [KvDtype] {
        self.inner.kv_dtypes()
    }
    fn alloc_kv(&self, g: KvGeometry) -> Result<Self::Buf> {
        shared(self.inner.alloc_kv(g))
    }
    fn alloc_kv_as(&self, g: KvGeometry, dtype: KvDtype) -> Result<Self::Buf> {
        shared(self.inner.alloc_kv_as(g, dtype))
    }
    fn write_f32(&self, buf: &mut Self::Buf, data: &[f32]) -> Result<()> {
        self.no_io("write_f32")?;
        self.inner.write_f32(&mut buf.lock().unwrap(), data)
    }
    fn write_u32(&self, buf: &mut Self::Buf, data: &[u32]) -> Result<()> {
        self.no_io("write_u32")?;
        self.inner.write_u32(&mut buf.lock().unwrap(), data)
    }
    fn read_f32(&self, buf: &Self::Buf, len: usize) -> Result<Vec<f32>> {
        self.no_io("read_f32")?;
        self.inner.read_f32(&buf.lock().unwrap(), len)
    }
    fn read_u32(&self, buf: &Self::Buf, len: usize) -> Result<Vec<u32>> {
        self.no_io("read_u32")?;
        self.inner.read_u32(&buf.lock().unwrap(), len)
    }
    fn read_kv(&self, buf: &Self::Buf, g: KvGeometry) -> Result<Vec<f32>> {
        self.no_io("read_kv")?;
        self.inner.read_kv(&buf.lock().unwrap(), g)
    }
}

impl<B: Backend> Ops for Replay<B> {
    fn embedding(
        &self,
        table: &Self::Buf,
        ids: &Self::Buf,
        out: &mut Self::Buf,
        t: usize,
        hidden: usize,
    ) -> Result<()> {
        let (table, ids, out) = (table.clone(), ids.clone(), out.clone());
        self.op(move |b| b.embedding(&table.lock().unwrap(), &ids.lock().unwrap(), &mut out.lock().unwrap(), t, hidden))
    }
    fn gather_rows(&self, src: &Self::Buf, rows: &Self::Buf, out: &mut Self::Buf, n: usize, dim: usize) -> Result<()> {
        let (src, rows, out) = (src.clone(), rows.clone(), out.clone());
        self.op(move |b| b.gather_rows(&src.lock().unwrap(), &rows.lock().unwrap(), &mut out.lock().unwrap(), n, dim))
    }
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let (x, w, out) = (x.clone(), w.clone(), out.clone());
        self.op(move |b| b.rms_norm(&x.lock().unwrap(), &w.lock().unwrap(), &mut out.lock().unwrap(), rows, dim, eps))
    }
    fn add(&self, acc: &mut Self::Buf, x: &Self::Buf, len: usize) -> Result<()> {
        let (acc, x) = (acc.clone(), x.clone());
        self.op(move |b| b.add(&mut acc.lock().unwrap(), &x.lock().unwrap(), len))
    }
    fn matmul(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
        out: &mut Self::Buf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let (x, w, bias, out) = (x.clone(), w.clone(), bias.cloned(), out.clone());
        self.op(move |b| {
            let bias = bias.as_ref().map(|b| b.lock().unwrap());
            b.matmul(&x.lock().unwrap(), &w.lock().unwrap(), bias.as_deref(), &mut out.lock().unwrap(), m, n, k)
        })
    }
    fn rope(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        positions: &Self::Buf,
        inv_freq: &Self::Buf,
        t: usize,
        qh: usize,
        kvh: usize,
        hd: usize,
    ) -> Result<()> {
        let (q, k, positions, inv_freq) = (q.clone(), k.clone(), positions.clone(), inv_freq.clone());
        self.op(move |b| {
            b.rope(
                &mut q.lock().unwrap(),
                &mut k.lock().unwrap(),
                &positions.lock().unwrap(),
                &inv_freq.lock().unwrap(),
                t,
                qh,
                kvh,
                hd,
            )
        })
    }
    fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize) -> Result<()> {
        let (gate, up, out) = (gate.clone(), up.clone(), out.clone());
        self.op(move |b| b.silu_mul(&gate.lock().unwrap(), &up.lock().unwrap(), &mut out.lock().unwrap(), len))
    }
    fn gelu_tanh_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize) -> Result<()> {
        let (gate, up, out) = (gate.clone(), up.clone(), out.clone());
        self.op(move |b| b.gelu_tanh_mul(&gate.lock().unwrap(), &up.lock().unwrap(), &mut out.lock().unwrap(), len))
    }
    fn scale(&self, x: &mut Self::Buf, factor: f32, len: usize) -> Result<()> {
        let x = x.clone();
        self.op(move |b| b.scale(&mut x.lock().unwrap(), factor, len))
    }
    fn kv_write(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        kc: &mut Self::Buf,
        vc: &mut Self::Buf,
        slots: &Self::Buf,
        t: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let (k, v, kc, vc, slots) = (k.clone(), v.clone(), kc.clone(), vc.clone(), slots.clone());
        self.op(move |b| {
            b.kv_write(
                &k.lock().unwrap(),
                &v.lock().unwrap(),
                &mut kc.lock().unwrap(),
                &mut vc.lock().unwrap(),
                &slots.lock().unwrap(),
                t,
                g,
            )
        })
    }
    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut Self::Buf) -> Result<()> {
        let bufs = [a.q, a.k_cache, a.v_cache, a.positions, a.token_seq, a.block_tables].map(Arc::clone);
        let (out, (num_tokens, num_seqs, max_blocks, max_context, decode_tokens, num_heads, geometry, scale, window)) = (
            out.clone(),
            (
                a.num_tokens,
                a.num_seqs,
                a.max_blocks,
                a.max_context,
                a.decode_tokens,
                a.num_heads,
                a.geometry,
                a.scale,
                a.window,
            ),
        );
        self.op(move |b| {
            let g = bufs.each_ref().map(|x| x.lock().unwrap());
            let args = AttnArgs::<B> {
                q: &*g[0],
                k_cache: &*g[1],
                v_cache: &*g[2],
                positions: &*g[3],
                token_seq: &*g[4],
                block_tables: &*g[5],
                num_tokens,
                num_seqs,
                max_blocks,
                max_context,
                decode_tokens,
                num_heads,
                geometry,
                scale,
                window,
            };
            b.paged_attention(&args, &mut out.lock().unwrap())
        })
    }
}

impl<B: Backend> FusedOps for Replay<B> {}

impl<B: Backend> Sampling for Replay<B> {}

const BLOCK: usize = 16;
/// Blocks per sequence: 4 x 16 = 64 tokens of context.
const PER_SEQ: usize = 4;
const SEQS: usize = 6;
/// Context bound of a padded step (two blocks).
const PAD_CONTEXT: usize = 32;

fn model_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-graphs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    dir
}

/// max_seqs 8: buckets 1, 2, 4, 8. A padded step serves contexts up to 32 tokens (2 blocks):
/// the later steps of the longest prompt run eagerly, the others padded.
fn opts(graphs: bool, pad_decode: bool) -> LoadOptions {
    LoadOptions {
        max_batch_tokens: 128,
        max_seqs: 8,
        num_kv_blocks: SEQS * PER_SEQ,
        block_size: BLOCK,
        graphs,
        pad_decode,
        graph_max_context: PAD_CONTEXT,
        ..Default::default()
    }
}

/// Sequences with their own blocks; `done[i]` tokens of each have their K/V in the cache.
struct Seqs {
    tokens: Vec<Vec<u32>>,
    done: Vec<usize>,
}

impl Seqs {
    fn new() -> Self {
        let lens = [3usize, 17, 1, 30, 9, 22];
        let tokens = lens
            .iter()
            .enumerate()
            .map(|(s, &n)| (0..n).map(|i| ((s * 31 + i * 7 + 5) % 250) as u32).collect())
            .collect();
        Seqs { tokens, done: vec![0; SEQS] }
    }
    fn table(s: usize) -> Vec<u32> {
        (0..PER_SEQ).map(|b| (s * PER_SEQ + b) as u32).collect()
    }
    /// The step that feeds each of `which` its tokens not yet in the cache.
    fn batch(&self, which: &[usize]) -> ForwardBatch {
        let mut b = ForwardBatch { max_blocks: PER_SEQ, ..Default::default() };
        for &s in which {
            b.push_seq(&self.tokens[s][self.done[s]..], self.done[s], &Self::table(s), BLOCK, true);
        }
        b
    }
    fn advance(&mut self, which: &[usize], ids: &[u32]) {
        for (&s, &id) in which.iter().zip(ids) {
            self.done[s] = self.tokens[s].len();
            self.tokens[s].push(id);
        }
    }
}

/// Prefill in two mixed steps, then decode steps of changing composition and size (1 to 6
/// rows: buckets 1, 2, 4 and 8), on `a` and `b` side by side: every step's logits bitwise
/// equal, ids fed back. Returns how many decode steps ran, and how many of them had every
/// context within the padding's bound (`PAD_CONTEXT`).
fn lockstep(a: &mut dyn ModelRunner, b: &mut dyn ModelRunner) -> (usize, usize) {
    let mut seqs = Seqs::new();
    let vocab = a.config().vocab_size;
    let mut step = |which: &[usize], seqs: &mut Seqs| {
        let batch = seqs.batch(which);
        let within = batch.positions.iter().all(|&p| (p as usize) < PAD_CONTEXT);
        let (la, lb) = (a.forward(&batch).unwrap(), b.forward(&batch).unwrap());
        assert_eq!(la.len(), which.len() * vocab);
        let (ba, bb): (Vec<u32>, Vec<u32>) =
            (la.iter().map(|x| x.to_bits()).collect(), lb.iter().map(|x| x.to_bits()).collect());
        assert!(ba == bb, "step over {which:?} (positions {:?}): logits differ", batch.positions);
        let ids: Vec<u32> = la.chunks_exact(vocab).map(tandem_core::backend::argmax_row).collect();
        seqs.advance(which, &ids);
        within
    };
    step(&[0, 1, 2], &mut seqs);
    step(&[3, 4, 5], &mut seqs);
    let plan: [&[usize]; 8] =
        [&[0], &[2, 0], &[1, 3, 5], &[0, 1, 2, 3, 4, 5], &[4], &[5, 4, 3, 2, 1], &[2, 3], &[0, 1, 2, 3, 4, 5]];
    let (mut n, mut within) = (0, 0);
    for _round in 0..3 {
        for which in plan {
            within += step(which, &mut seqs) as usize;
            n += 1;
        }
    }
    (n, within)
}

fn load<B: Backend>(b: B, dir: &Path, o: LoadOptions) -> Model<B> {
    Model::load(b, dir, o).unwrap()
}

#[test]
fn padded_decode_gives_the_eager_logits_and_kv_alone_and_in_batches() {
    let dir = model_dir("pad");
    let mut eager = load(RefBackend::new(), &dir, opts(false, false));
    let mut padded = load(RefBackend::new(), &dir, opts(false, true));
    assert_eq!(eager.decode_buckets(), vec![]);
    assert_eq!(padded.decode_buckets(), vec![(1, false), (2, false), (4, false), (8, false)]);
    // The scratch block is the model's own: the engine sees the pool it asked for.
    assert_eq!(padded.kv_geometry(), eager.kv_geometry());
    assert_eq!(padded.kv_geometry().num_blocks, SEQS * PER_SEQ);
    let (steps, within) = lockstep(&mut eager, &mut padded);
    assert_eq!(steps, 24);
    assert!(within > 0 && within < steps, "{within} of {steps} steps padded: the plan should exercise both paths");
    // Padding rows wrote their K/V to the scratch block only: every block the engine owns holds
    // bitwise what the unpadded run wrote (including the blocks no sequence reached).
    let (ka, kb) = (eager.read_kv_pool().unwrap(), padded.read_kv_pool().unwrap());
    assert_eq!(ka.len(), kb.len());
    let differ = ka.iter().zip(&kb).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(differ, 0, "{differ} KV values differ between the padded and the unpadded run");
    // A batch naming the scratch block is refused: it is not the engine's to hand out.
    let mut bad = ForwardBatch { max_blocks: 1, ..Default::default() };
    bad.push_seq(&[1], 0, &[(SEQS * PER_SEQ) as u32], BLOCK, true);
    assert!(padded.forward(&bad).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replayed_decode_steps_give_the_eager_logits() {
    let dir = model_dir("replay");
    let mut eager = load(RefBackend::new(), &dir, opts(false, false));
    let mut graphed = load(Replay::new(RefBackend::new()), &dir, opts(true, false));
    assert_eq!(graphed.decode_buckets(), vec![(1, true), (2, true), (4, true), (8, true)]);
    assert_eq!(graphed.backend().replays.load(Ordering::Relaxed), 0, "capture at load replays nothing");
    let (steps, within) = lockstep(&mut eager, &mut graphed);
    let replays = graphed.backend().replays.load(Ordering::Relaxed);
    // Every decode step within the bound replayed its bucket's graph; the others ran eagerly.
    assert_eq!(replays, within, "{replays} replays over {steps} decode steps, {within} within the bound");
    let differ = eager
        .read_kv_pool()
        .unwrap()
        .iter()
        .zip(&graphed.read_kv_pool().unwrap())
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differ, 0);
    // Graphs off: the same backend, every step eager and unpadded.
    let off = load(Replay::new(RefBackend::new()), &dir, opts(false, false));
    assert_eq!(off.decode_buckets(), vec![]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same with an fp8 cache: padded steps and replayed graphs give the eager steps' logits,
/// and every block the engine owns holds bitwise what the eager run wrote.
#[test]
fn fp8_kv_padded_and_replayed_decode_give_the_eager_logits() {
    let dir = model_dir("fp8");
    let fp8 = |o: LoadOptions| LoadOptions { kv_dtype: Some(KvDtype::Fp8E4m3), ..o };
    let mut eager = load(RefBackend::new(), &dir, fp8(opts(false, false)));
    let mut padded = load(RefBackend::new(), &dir, fp8(opts(false, true)));
    let (steps, within) = lockstep(&mut eager, &mut padded);
    assert!(within > 0 && within < steps, "{within} of {steps} steps padded");
    let bits = |m: &dyn Fn() -> Vec<f32>| m().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&|| eager.read_kv_pool().unwrap()), bits(&|| padded.read_kv_pool().unwrap()));
    let mut eager = load(RefBackend::new(), &dir, fp8(opts(false, false)));
    let mut graphed = load(Replay::new(RefBackend::new()), &dir, fp8(opts(true, false)));
    let (_, within) = lockstep(&mut eager, &mut graphed);
    assert_eq!(graphed.backend().replays.load(Ordering::Relaxed), within);
    assert_eq!(bits(&|| eager.read_kv_pool().unwrap()), bits(&|| graphed.read_kv_pool().unwrap()));
    // The cache is fp8: its values are e4m3 values.
    let f = tandem_core::fp8::Fp8Format::E4M3;
    assert!(eager.read_kv_pool().unwrap().iter().all(|&v| f.decode(tandem_core::fp8_round::encode(f, v)) == v));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Capture and replay failures are not request failures: a model whose second capture fails
/// loads with every bucket eager, and a model whose replays fail runs each step eagerly from
/// the first failure on; both give the eager logits throughout.
#[test]
fn failed_captures_and_replays_fall_back_to_eager() {
    let dir = model_dir("fallback");
    let mut eager = load(RefBackend::new(), &dir, opts(false, false));
    let mut b = Replay::new(RefBackend::new());
    b.fail_capture_after = Some(1);
    let mut no_graphs = load(b, &dir, opts(true, false));
    assert_eq!(no_graphs.decode_buckets(), vec![(1, false), (2, false), (4, false), (8, false)]);
    lockstep(&mut eager, &mut no_graphs);
    assert_eq!(no_graphs.backend().replays.load(Ordering::Relaxed), 0);

    let mut eager = load(RefBackend::new(), &dir, opts(false, false));
    let mut b = Replay::new(RefBackend::new());
    b.fail_replays = true;
    let mut failing = load(b, &dir, opts(true, false));
    assert!(failing.decode_buckets().iter().all(|&(_, g)| g), "captured at load");
    let (_, within) = lockstep(&mut eager, &mut failing);
    assert!(within > 0);
    assert!(failing.decode_buckets().iter().all(|&(_, g)| !g), "graphs dropped after a failed replay");
    let _ = std::fs::remove_dir_all(&dir);
}
