//! Paged attention over a cache whose blocks are scattered: decode tokens, prefill chunks with
//! a cached prefix (causal inside the chunk), and both in one batch.
//!
//! Every slot of the cache holds random K/V, including slots past each sequence's context and
//! blocks no sequence owns; a backend that reads beyond `positions[t]` or through a padding
//! entry of the block table (0, which is another sequence's block) gets a different answer.

use tandem_core::backend::{AttnArgs, Backend, KvDtype, KvGeometry};
use tandem_core::Result;

use super::kv::{filled_cache, kv_param, kv_unsupported};
use super::{limits, poisoned, read_guarded, untouched_f32, untouched_u32, upload_f32, upload_u32, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

/// One sequence in the batch: `cached` tokens already in the cache, then `query` new tokens
/// at positions `cached..cached + query` (their K/V are in the cache too, as after kv_write).
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk {
    pub cached: usize,
    pub query: usize,
}

impl SeqChunk {
    pub fn decode(context: usize) -> Self {
        SeqChunk { cached: context - 1, query: 1 }
    }
    pub fn context(&self) -> usize {
        self.cached + self.query
    }
}

pub struct PagedAttention {
    pub block_size: usize,
    pub kv_heads: usize,
    /// Query heads per KV head.
    pub gqa: usize,
    pub head_dim: usize,
    pub seqs: Vec<SeqChunk>,
    /// Blocks owned by no sequence (random contents that must never be read).
    pub spare_blocks: usize,
    /// Sliding window in keys (`AttnArgs::window`); 0: the whole context.
    pub window: usize,
    /// The cache's element type; `None`: the backend's default. Both sides hold the same
    /// cache bits for fp8 (kv_write's case checks that), so the limit stays the f32 one's.
    pub kv_dtype: Option<KvDtype>,
}

pub struct AttnInputs {
    geometry: KvGeometry,
    cache_k: Vec<f32>, // [slots, kv_heads, head_dim]
    cache_v: Vec<f32>,
    q: Vec<f32>,            // [T, heads, head_dim]
    positions: Vec<u32>,    // [T]
    token_seq: Vec<u32>,    // [T]
    block_tables: Vec<u32>, // [num_seqs, max_blocks]
    max_blocks: usize,
}

impl PagedAttention {
    fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.query).sum()
    }
    fn heads(&self) -> usize {
        self.kv_heads * self.gqa
    }
    fn blocks_needed(&self) -> usize {
        self.seqs.iter().map(|s| s.context().div_ceil(self.block_size)).sum()
    }
}

impl Op for PagedAttention {
    type Inputs = AttnInputs;
    const NAME: &'static str = "paged_attention";
    fn params(&self) -> String {
        let seqs: Vec<String> = self.seqs.iter().map(|s| format!("{}+{}", s.cached, s.query)).collect();
        let window = if self.window > 0 { format!(" window={}", self.window) } else { String::new() };
        format!(
            "block_size={} kv_heads={} gqa={} head_dim={} seqs(cached+query)=[{}]{window}{}",
            self.block_size,
            self.kv_heads,
            self.gqa,
            self.head_dim,
            seqs.join(","),
            kv_param(self.kv_dtype)
        )
    }
    fn limit(&self) -> f64 {
        limits::ATTENTION
    }
    fn cost(&self) -> Cost {
        let row = (self.kv_heads * self.head_dim) as f64;
        let kv_bytes: f64 = self.seqs.iter().map(|s| 2.0 * 4.0 * row * s.context() as f64).sum();
        let qo_bytes = 2.0 * 4.0 * (self.num_tokens() * self.heads() * self.head_dim) as f64;
        let flops: f64 = self
            .seqs
            .iter()
            .flat_map(|s| (0..s.query).map(move |i| (s.cached + i + 1) as f64))
            .map(|ctx| 4.0 * ctx * (self.heads() * self.head_dim) as f64)
            .sum();
        Cost { bytes: kv_bytes + qo_bytes, flops }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let bs = self.block_size;
        let num_blocks = self.blocks_needed() + self.spare_blocks;
        let geometry = KvGeometry { num_blocks, block_size: bs, num_kv_heads: self.kv_heads, head_dim: self.head_dim };
        // One column more than any sequence needs, so every row ends in padding zeros.
        let max_blocks = self.seqs.iter().map(|s| s.context().div_ceil(bs)).max().unwrap_or(0) + 1;
        let order = rng.permutation(num_blocks);
        let mut next = order.iter();
        let mut block_tables = vec![0u32; self.seqs.len() * max_blocks];
        let (mut positions, mut token_seq) = (vec![], vec![]);
        for (i, s) in self.seqs.iter().enumerate() {
            for j in 0..s.context().div_ceil(bs) {
                block_tables[i * max_blocks + j] = *next.next().expect("num_blocks covers every sequence") as u32;
            }
            for p in s.cached..s.context() {
                positions.push(p as u32);
                token_seq.push(i as u32);
            }
        }
        let row = self.kv_heads * self.head_dim;
        AttnInputs {
            geometry,
            cache_k: rng.normals(geometry.slots() * row, 1.0),
            cache_v: rng.normals(geometry.slots() * row, 1.0),
            // q at scale 2 makes the softmax peaked enough that a wrong key shows.
            q: rng.normals(self.num_tokens() * self.heads() * self.head_dim, 2.0),
            positions,
            token_seq,
            block_tables,
            max_blocks,
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let g = x.geometry;
        let t = self.num_tokens();
        let len = t * self.heads() * self.head_dim;
        if let Some(why) = kv_unsupported(b, self.kv_dtype) {
            launch.skip(why);
            return Ok(vec![]);
        }
        let (k_cache, v_cache) = filled_cache(b, g, self.kv_dtype, &x.cache_k, &x.cache_v)?;
        let q = upload_f32(b, &x.q)?;
        let positions = upload_u32(b, &x.positions)?;
        let token_seq = upload_u32(b, &x.token_seq)?;
        let block_tables = upload_u32(b, &x.block_tables)?;
        let args = AttnArgs {
            q: &q,
            k_cache: &k_cache,
            v_cache: &v_cache,
            positions: &positions,
            token_seq: &token_seq,
            block_tables: &block_tables,
            num_tokens: t,
            num_seqs: self.seqs.len(),
            max_blocks: x.max_blocks,
            max_context: self.seqs.iter().map(|s| s.context()).max().unwrap_or(0),
            decode_tokens: tandem_core::batch::leading_decodes(&x.token_seq),
            num_heads: self.heads(),
            geometry: g,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: self.window,
        };
        let mut out = poisoned(b, len)?;
        launch.run(b, || b.paged_attention(&args, &mut out))?;
        untouched_f32(b, &q, &x.q, "q")?;
        untouched_u32(b, &positions, &x.positions, "positions")?;
        untouched_u32(b, &token_seq, &x.token_seq, "token_seq")?;
        untouched_u32(b, &block_tables, &x.block_tables, "block_tables")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, len, "out")?)])
    }
}
