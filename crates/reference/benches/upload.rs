//! Host cost of one step's metadata upload on the reference backend, before and after the
//! staging layout (crates/core/src/meta.rs), for decode steps padded to buckets 1, 64 and 256
//! and for the same steps unpadded.
//!
//! Run: `cargo bench -p tandem-reference --bench upload` (plain timing loop, no criterion).
//! "before" is the path model.rs had until the staging layout, rebuilt here as the baseline:
//! `pad_decode` built a padded `ForwardBatch` (six fresh Vecs), then six `write_u32`s into
//! separate buffers. "after" is what the model does now: `MetaStaging::stage_padded` (or
//! `stage_batch`) into the group's staging memory, then one `upload_u32_group`. On the
//! reference a write is a memcpy into host memory, so this measures the host's side alone;
//! on CUDA "after" is one asynchronous copy from page-locked memory instead of six pageable
//! ones; "(stage only)" is the padded step's staging alone, the host's part of it on CUDA.
//! Limits as a large server's: 8192 tokens, 256 sequences, a 131072-token context
//! (8192 blocks of 16 per block-table row), padded steps at graph_max_context 8192 (stride
//! 512); each real sequence has a 1000-token context (63 blocks).

use std::hint::black_box;
use std::time::Instant;

use tandem_core::backend::prelude::*;
use tandem_core::meta::{self, MetaStaging, PadRows};
use tandem_core::ForwardBatch;
use tandem_reference::RefBackend;

const MAX_TOKENS: usize = 8192;
const MAX_SEQS: usize = 256;
const MAX_BLOCKS_CAP: usize = 8192;
const LOGIT_ROWS: usize = MAX_SEQS + 128;
const BLOCK: usize = 16;
const CONTEXT: usize = 1000;

/// The old model.rs `upload`: six writes into separate buffers.
fn six_writes(b: &RefBackend, bufs: &mut [<RefBackend as Storage>::Buf], batch: &ForwardBatch) {
    let parts: [&[u32]; 6] =
        [&batch.tokens, &batch.positions, &batch.slots, &batch.token_seq, &batch.block_tables, &batch.logit_rows];
    for (buf, p) in bufs.iter_mut().zip(parts) {
        b.write_u32(buf, p).unwrap();
    }
}

fn decode_batch(n: usize) -> ForwardBatch {
    let blocks = CONTEXT.div_ceil(BLOCK);
    let mut b = ForwardBatch { max_blocks: blocks, ..Default::default() };
    for s in 0..n {
        let table: Vec<u32> = (0..blocks).map(|i| (s * blocks + i) as u32).collect();
        b.push_seq(&[(s % 1000) as u32], CONTEXT - 1, &table, BLOCK, true);
    }
    b
}

/// Mean microseconds of `f` over enough runs for about 0.3 s, after a warm-up.
fn time(mut f: impl FnMut()) -> f64 {
    for _ in 0..20 {
        f();
    }
    let (mut runs, start) = (0u32, Instant::now());
    while start.elapsed().as_secs_f64() < 0.3 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() * 1e6 / runs as f64
}

fn main() {
    let b = RefBackend::new();
    let layout = meta::layout(MAX_TOKENS, LOGIT_ROWS, MAX_SEQS * MAX_BLOCKS_CAP).unwrap();
    let mut group = b.alloc_u32_group(&layout).unwrap();
    let mut staging = MetaStaging::new(layout.clone(), MAX_SEQS);
    let caps = [MAX_TOKENS, MAX_TOKENS, MAX_TOKENS, MAX_TOKENS, MAX_SEQS * MAX_BLOCKS_CAP, LOGIT_ROWS];
    let mut separate: Vec<_> = caps.iter().map(|&c| b.alloc_u32(c).unwrap()).collect();
    let pad = PadRows { scratch_block: 1 << 20, stride: 8192 / BLOCK, block_size: BLOCK as u32 };
    println!(
        "us per upload (reference backend; before: pad_decode + six write_u32, after: staging + one upload_u32_group)"
    );
    println!(
        "{:>6} {:>5} | {:>14} {:>13} {:>12} | {:>16} {:>15}",
        "bucket", "real", "padded before", "padded after", "(stage only)", "unpadded before", "unpadded after"
    );
    for (bucket, real) in [(1usize, 1usize), (64, 49), (256, 200)] {
        let batch = decode_batch(real);
        let padded_before = time(|| {
            let p = meta::pad_decode(black_box(&batch), pad, bucket);
            six_writes(&b, &mut separate, &p);
        });
        let padded_after = time(|| {
            let used =
                staging.stage_padded(b.u32_staging(&mut group).unwrap(), black_box(&batch), pad, bucket).unwrap();
            b.upload_u32_group(&mut group, &used).unwrap();
        });
        // What the host does on CUDA besides queueing the copy: the reference's upload is a
        // memcpy of the span, CUDA's a DMA from the page-locked memory.
        let padded_stage = time(|| {
            black_box(
                staging.stage_padded(b.u32_staging(&mut group).unwrap(), black_box(&batch), pad, bucket).unwrap(),
            );
        });
        let unpadded_before = time(|| six_writes(&b, &mut separate, black_box(&batch)));
        let unpadded_after = time(|| {
            let used = staging.stage_batch(b.u32_staging(&mut group).unwrap(), black_box(&batch)).unwrap();
            b.upload_u32_group(&mut group, &used).unwrap();
        });
        println!("{bucket:>6} {real:>5} | {padded_before:>14.2} {padded_after:>13.2} {padded_stage:>12.2} | {unpadded_before:>16.2} {unpadded_after:>15.2}");
    }
}
