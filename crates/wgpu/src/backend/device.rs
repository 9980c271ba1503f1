//! The `Device` group of `WgpuBackend`: its name, what it can say about memory, waiting for
//! the device, and the adapter's limits and counters.

use tandem_core::backend::Device;
use tandem_core::Result;

use super::operand::err;
use super::WgpuBackend;
use crate::adapter::{AdapterSummary, NAME};
use crate::recorder::Stats;

impl Device for WgpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// wgpu has no portable query for free device memory, so this says nothing rather than guess.
    fn free_memory(&self) -> Option<u64> {
        None
    }

    fn sync(&self) -> Result<()> {
        self.rec.finish()
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(self.weight_bytes.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl WgpuBackend {
    /// The adapter in use: name, wgpu backend, device type, driver.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.rec.gpu.summary
    }

    pub fn limits(&self) -> &wgpu::Limits {
        &self.rec.gpu.limits
    }

    /// Dispatch counts per kernel, submits and time spent waiting, since the last reset.
    pub fn stats(&self) -> Stats {
        self.rec.stats()
    }

    pub fn reset_stats(&self) {
        self.rec.reset_stats()
    }

    /// Times every dispatch on the device (timestamp queries, read back at each submit; slows
    /// the run down). Returns false, and does nothing, when the adapter has no timestamps.
    pub fn set_profiling(&self, on: bool) -> bool {
        self.rec.set_profiling(on)
    }

    /// True when every op queued so far has run on the device (tests of `Backend::sync`).
    pub fn is_idle(&self) -> Result<bool> {
        self.rec.is_idle()
    }

    pub(super) fn check_loops(&self, op: &str, shape: &str, iterations: usize) -> Result<()> {
        match self.loop_limit {
            Some(l) if iterations > l => Err(err(format!(
                "{op}: {shape} needs {iterations} loop iterations in one invocation; adapter {} stops loops after 65535 \
                 (llvmpipe's limit), so the result would be wrong",
                self.adapter()
            ))),
            _ => Ok(()),
        }
    }
}
