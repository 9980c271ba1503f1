//! GPU-only: the step's metadata group as CUDA carves it (regions are views into one
//! allocation, page-locked staging memory, one asynchronous copy, an event waited on before
//! the host writes again) passes the same checks as the reference's separate buffers
//! (`tandem_conformance::staging`). The model's path through it is covered by graphs.rs and
//! gpu_invariance.rs. Without a driver it prints SKIPPED (TANDEM_REQUIRE_CUDA=1 fails).

#[test]
fn carved_u32_groups_stage_and_upload_like_separate_buffers() {
    let Some(b) = crate::gpu_or_skip("cuda u32 groups") else { return };
    // Twice on one backend: the second group is allocated after the first is dropped.
    for _ in 0..2 {
        tandem_conformance::staging::check_u32_group(&b).unwrap();
    }
    b.synchronize().unwrap();
}

/// The host writes the staging memory again only once the last copy from it has run
/// (`u32_staging` waits on the copy's event): a kernel queued after each of two uploads, with
/// nothing synchronizing in between, reads each step's ids. On the fake driver a copy runs only
/// when the host waits, so leaving the wait out fails here every time (on a GPU, when the copy is
/// slower than the host).
#[test]
fn staging_is_not_rewritten_before_its_copy_ran() {
    use tandem_core::backend::prelude::*;
    use tandem_core::backend::U32Layout;
    let Some(b) = crate::gpu_or_skip("cuda staging event") else { return };
    let (tokens, vocab, hidden) = (4usize, 8usize, 4usize);
    let layout = U32Layout::new(&[tokens]).unwrap();
    let mut g = b.alloc_u32_group(&layout).unwrap();
    let table: Vec<f32> = (0..vocab * hidden).map(|i| i as f32).collect();
    let mut t = b.alloc_f32(table.len()).unwrap();
    b.write_f32(&mut t, &table).unwrap();
    let id = |step: usize, i: usize| (step * tokens + i + 1) % vocab;
    let mut outs = vec![];
    for step in 0..2 {
        let s = b.u32_staging(&mut g).unwrap();
        for (i, v) in s.iter_mut().take(tokens).enumerate() {
            *v = id(step, i) as u32;
        }
        b.upload_u32_group(&mut g, &[tokens]).unwrap();
        let mut out = b.alloc_f32(tokens * hidden).unwrap();
        b.embedding(&t, &g.parts[0], &mut out, tokens, hidden).unwrap();
        outs.push(out);
    }
    for (step, out) in outs.iter().enumerate() {
        let got = b.read_f32(out, tokens * hidden).unwrap();
        let want: Vec<f32> =
            (0..tokens).flat_map(|i| table[id(step, i) * hidden..(id(step, i) + 1) * hidden].to_vec()).collect();
        assert_eq!(got, want, "step {step}: the embedding did not read the ids staged for it");
    }
}
