//! Device and page-locked host memory: each allocation its own mapping, filled with 0xFF, its
//! end (rounded up to 256 bytes, CUDA's alignment) against an inaccessible guard page. A freed
//! allocation's pages are made inaccessible and released, and the mapping is kept, so its
//! addresses are never handed out again: a kernel that still uses them faults.

use std::collections::BTreeMap;

use cudarc::driver::sys::CUresult;

use crate::state::{fail, Res};

const PAGE: usize = 4096;
const ALIGN: usize = 256;

#[derive(Debug, Clone, Copy)]
pub struct Region {
    pub base: usize,
    /// Bytes asked for.
    pub size: usize,
    map: usize,
    map_len: usize,
}

pub struct Memory {
    pub total: usize,
    pub used: usize,
    device: BTreeMap<usize, Region>,
    host: BTreeMap<usize, Region>,
}

fn map(bytes: usize) -> Res<Region> {
    let span = bytes.max(1).div_ceil(ALIGN) * ALIGN;
    let pages = span.div_ceil(PAGE) * PAGE;
    let map_len = pages + PAGE;
    // SAFETY: a fresh private anonymous mapping; the guard page is ours.
    unsafe {
        let m = libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if m == libc::MAP_FAILED {
            return Err(fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY, &format!("mmap of {map_len} bytes failed")));
        }
        let m = m as usize;
        if libc::mprotect((m + pages) as *mut libc::c_void, PAGE, libc::PROT_NONE) != 0 {
            return Err(fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY, "mprotect of a guard page failed"));
        }
        let base = m + pages - span;
        std::ptr::write_bytes(base as *mut u8, 0xff, span);
        Ok(Region { base, size: bytes, map: m, map_len })
    }
}

fn retire(r: &Region) {
    // SAFETY: the region's own mapping; nothing of ours reads it again.
    unsafe {
        libc::madvise(r.map as *mut libc::c_void, r.map_len, libc::MADV_DONTNEED);
        libc::mprotect(r.map as *mut libc::c_void, r.map_len, libc::PROT_NONE);
    }
}

fn find(m: &BTreeMap<usize, Region>, p: usize) -> Option<&Region> {
    let (_, r) = m.range(..=p).next_back()?;
    (p < r.base + r.size.max(1)).then_some(r)
}

impl Memory {
    pub fn new(total: usize) -> Memory {
        Memory { total, used: 0, device: BTreeMap::new(), host: BTreeMap::new() }
    }

    fn charge(size: usize) -> usize {
        size.div_ceil(ALIGN) * ALIGN
    }

    pub fn alloc_device(&mut self, bytes: usize) -> Res<usize> {
        if bytes == 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "an allocation of 0 bytes"));
        }
        if self.used + Self::charge(bytes) > self.total {
            return Err(fail(
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                &format!(
                    "{bytes} bytes asked, {} of {} free (TANDEM_FAKE_CUDA_MEMORY_MB sets the fake device's memory)",
                    self.total - self.used,
                    self.total
                ),
            ));
        }
        let r = map(bytes)?;
        self.used += Self::charge(bytes);
        self.device.insert(r.base, r);
        Ok(r.base)
    }

    pub fn free_device(&mut self, base: usize) -> Res<()> {
        let Some(r) = self.device.remove(&base) else {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                &format!("free of {base:#x}, which is not the start of a live device allocation"),
            ));
        };
        self.used -= Self::charge(r.size);
        retire(&r);
        Ok(())
    }

    pub fn alloc_host(&mut self, bytes: usize) -> Res<usize> {
        let r = map(bytes)?;
        self.host.insert(r.base, r);
        Ok(r.base)
    }

    pub fn free_host(&mut self, base: usize) -> Res<()> {
        let Some(r) = self.host.remove(&base) else {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                &format!("cuMemFreeHost of {base:#x}, which is not page-locked memory from cuMemHostAlloc"),
            ));
        };
        retire(&r);
        Ok(())
    }

    /// The live device allocation holding address `p`.
    pub fn device_at(&self, p: usize) -> Option<Region> {
        find(&self.device, p).copied()
    }

    /// Whether `[p, p + n)` lies inside one live device allocation.
    pub fn device_range(&self, p: usize, n: usize) -> bool {
        find(&self.device, p).is_some_and(|r| p + n <= r.base + r.size)
    }

    /// Whether `[p, p + n)` lies inside one live page-locked host allocation.
    pub fn host_range(&self, p: usize, n: usize) -> bool {
        find(&self.host, p).is_some_and(|r| p + n <= r.base + r.size)
    }
}
