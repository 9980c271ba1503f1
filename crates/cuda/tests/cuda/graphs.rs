//! GPU-only: decode steps replayed from CUDA graphs give bitwise the logits of eager steps
//! (`LoadOptions::graphs = false`, what `--enforce-eager` sets), alone and in batches of
//! changing composition (buckets 1, 2, 4, 8), and a replay counts the kernels it runs. Steps
//! whose context is beyond the graphs' bound run eagerly in the same run. Also prints the mean
//! step time of each model (information, not asserted). Without a driver it prints SKIPPED
//! (TANDEM_REQUIRE_CUDA=1 fails).

use std::time::Instant;

use tandem_core::model::LoadOptions;
use tandem_core::{ForwardBatch, Model, ModelRunner};
use tandem_cuda::CudaBackend;

fn gpu() -> Option<CudaBackend> {
    crate::gpu_or_skip("cuda graphs vs eager")
}

const BLOCK: usize = 16;
const PER_SEQ: usize = 8;
const SEQS: usize = 6;
/// The graphs' context bound: the longer prompts leave it during the run.
const PAD_CONTEXT: usize = 64;

#[test]
fn graph_replays_give_the_eager_logits_and_launch_counts() {
    let Some(a) = gpu() else { return };
    let Some(b) = gpu() else { return };
    let dir = crate::random_model(crate::shape_hd64());
    let opts = |graphs| LoadOptions {
        max_batch_tokens: 256,
        max_seqs: 8,
        num_kv_blocks: SEQS * PER_SEQ,
        block_size: BLOCK,
        graphs,
        graph_max_context: PAD_CONTEXT,
        ..Default::default()
    };
    let mut eager = Model::<CudaBackend>::load(a, &dir, opts(false)).unwrap();
    let mut graphed = Model::<CudaBackend>::load(b, &dir, opts(true)).unwrap();
    assert_eq!(graphed.decode_buckets(), vec![(1, true), (2, true), (4, true), (8, true)], "every bucket captured");
    let vocab = eager.config().vocab_size;
    let lens = [5usize, 40, 1, 60, 17, 33];
    let mut tokens: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n).map(|i| ((s * 131 + i * 17 + 3) % 300) as u32).collect())
        .collect();
    let mut done = [0usize; SEQS];
    let table = |s: usize| (0..PER_SEQ).map(|b| (s * PER_SEQ + b) as u32).collect::<Vec<_>>();
    let (mut t_eager, mut t_graph, mut replayed, mut decode_steps) = (0f64, 0f64, 0usize, 0usize);
    let plan: [&[usize]; 8] =
        [&[0, 1, 2], &[3, 4, 5], &[0], &[2, 0], &[1, 3, 5], &[0, 1, 2, 3, 4, 5], &[5, 4, 3, 2, 1], &[2, 3]];
    for round in 0..4 {
        for (i, which) in plan.iter().enumerate() {
            if round > 0 && i < 2 {
                continue; // the prefill steps, once
            }
            let mut batch = ForwardBatch { max_blocks: PER_SEQ, ..Default::default() };
            for &s in *which {
                batch.push_seq(&tokens[s][done[s]..], done[s], &table(s), BLOCK, true);
            }
            let decode = batch.num_tokens() == which.len();
            let within = decode && batch.positions.iter().all(|&p| (p as usize) < PAD_CONTEXT);
            let (l0, t0) = (eager.backend().launches(), Instant::now());
            let le = eager.forward(&batch).unwrap();
            let (l1, t1, g0) = (eager.backend().launches(), Instant::now(), graphed.backend().launches());
            let lg = graphed.forward(&batch).unwrap();
            let (t2, g1) = (Instant::now(), graphed.backend().launches());
            let same = le.iter().zip(&lg).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same && le.len() == lg.len(),
                "step {which:?} at positions {:?}: graphed logits differ from eager",
                batch.positions
            );
            if decode {
                assert_eq!(g1 - g0, l1 - l0, "step {which:?}: a replay counts the kernels an eager step launches");
                decode_steps += 1;
                replayed += within as usize;
                t_eager += (t1 - t0).as_secs_f64();
                t_graph += (t2 - t1).as_secs_f64();
            }
            for (&s, row) in which.iter().zip(le.chunks_exact(vocab)) {
                done[s] = tokens[s].len();
                tokens[s].push(tandem_core::backend::argmax_row(row));
            }
        }
    }
    assert!(
        replayed > 0 && replayed < decode_steps,
        "{replayed} of {decode_steps} decode steps within the graphs' bound"
    );
    println!("{decode_steps} decode steps ({replayed} replayed): eager {:.3} ms, graphs {:.3} ms a step (incl. logits read-back)", t_eager * 1e3 / decode_steps as f64, t_graph * 1e3 / decode_steps as f64);
}

/// An allocation inside a capture is refused on either driver: the fake refuses the call, and its
/// failed capture is an error at the next sync (no silent eager fallback); real CUDA would
/// record it as a memory node, which `end_capture` refuses.
#[test]
fn an_allocation_inside_a_capture_is_an_error_on_either_driver() {
    use tandem_core::backend::{Device, Storage};
    let Some(b) = gpu() else { return };
    let fake = b.device_name().ends_with("(tandem fake driver)");
    b.begin_capture().unwrap();
    let alloc = b.alloc_f32(1024).map(drop);
    let ended = b.end_capture();
    if fake {
        assert!(alloc.is_err(), "the fake driver allocated while capturing");
        assert!(ended.is_err(), "a capture whose allocation was refused ended well on the fake driver");
        let e = b.sync().expect_err("a failed capture on the fake driver must be an error at the next sync");
        assert!(e.to_string().contains("failed on the fake driver"), "{e}");
    } else {
        let e = ended.expect_err("a captured step that allocates was accepted");
        assert!(e.to_string().contains("allocates device memory"), "{e}");
    }
    b.sync().expect("the failure is reported once; the backend works on");
    let v = b.weight_from_f32(tandem_core::DType::F32, &[1.0, 2.0]).unwrap();
    assert_eq!(b.read_f32(&v, 2).unwrap(), vec![1.0, 2.0]);
}
