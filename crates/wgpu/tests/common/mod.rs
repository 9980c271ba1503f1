//! Shared test helpers: the backend (or a skip, or a failure under TANDEM_REQUIRE_WGPU=1),
//! a seeded generator, and the NMSE check.
#![allow(dead_code)]

use std::sync::OnceLock;

use tandem_wgpu::{WgpuBackend, WgpuOptions};

/// The shared backend, or None when no adapter exists; each test that gets None notes itself
/// skipped (and returns). Panics only where the run demands wgpu: then absence is a failure,
/// not a skip.
pub fn backend() -> Option<&'static WgpuBackend> {
    static B: OnceLock<Result<WgpuBackend, String>> = OnceLock::new();
    match B.get_or_init(|| opened(WgpuBackend::with_options(WgpuOptions::default()).map_err(|e| e.to_string()))) {
        Ok(b) => Some(b),
        Err(e) => {
            skipped(e);
            None
        }
    }
}

/// A backend with `opts`, or None (the calling test noted skipped) when no adapter exists.
pub fn open(opts: WgpuOptions) -> Option<WgpuBackend> {
    match opened(WgpuBackend::with_options(opts).map_err(|e| e.to_string())) {
        Ok(b) => Some(b),
        Err(e) => {
            skipped(&e);
            None
        }
    }
}

fn opened(r: Result<WgpuBackend, String>) -> Result<WgpuBackend, String> {
    match &r {
        Ok(b) => eprintln!("wgpu adapter: {}", b.adapter()),
        Err(e) if std::env::var("TANDEM_REQUIRE_WGPU").as_deref() == Ok("1") => {
            panic!("TANDEM_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}")
        }
        Err(_) => {}
    }
    r
}

fn skipped(e: &str) {
    tandem_core::skip::note(format!("no wgpu adapter ({e}); set TANDEM_REQUIRE_WGPU=1 to make this a failure"));
}

/// SplitMix64: small, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// Seeded from TANDEM_TEST_SEED, else from the clock; the seed is printed so a failure can be replayed.
    pub fn new(test: &str) -> Self {
        let seed = std::env::var("TANDEM_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        });
        eprintln!("{test}: seed {seed} (TANDEM_TEST_SEED={seed} replays)");
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1), never exactly 0 in practice.
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Normalised mean squared error of `got` against `want`; fails on length mismatch or any
/// non-finite value (an unwritten, poisoned output shows up here).
pub fn assert_close(what: &str, got: &[f32], want: &[f64], limit: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (want {})", got[i], want[i]);
    }
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().max(1e-30);
    let nmse = num / den;
    eprintln!("{what}: nmse {nmse:.3e}");
    assert!(
        nmse <= limit,
        "{what}: nmse {nmse:.3e} > {limit:.0e}; first elements got {:?} want {:?}",
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}

/// Values as the device sees them after storing in `dtype`.
pub fn round_to(dtype: tandem_core::DType, v: &[f32]) -> Vec<f32> {
    dtype.to_f32(&dtype.from_f32(v))
}

pub const POISON: f32 = f32::NAN;
