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
