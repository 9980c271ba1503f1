//! lavapipe's compute workers, each on a CPU of its own (Linux, CPU adapters).
//!
//! On a CPU-side Vulkan the "device" is a pool of driver threads (lavapipe: one per CPU) that
//! share each dispatch's workgroups. Measured on the 2-vCPU CI machine: the scheduler now and
//! then leaves both workers on one CPU (a waker pulls the woken thread onto its own CPU), and
//! then a decode step runs on one core instead of two: "cores busy" 1.1-1.2 instead of 1.7 for
//! minutes at a time, the largest source of run-to-run spread in `decode_bench`. Pinning the
//! workers to distinct CPUs by hand (taskset) moved a running decode from 1.15-1.22 cores to
//! 1.69 at once. So the backend does that itself, once, after the first real work:
//!
//! - the driver's threads are the ones that appear while the device opens (a snapshot of
//!   `/proc/self/task` before and after), less lavapipe's render threads (`llvmpipe-N`) and
//!   its shader-cache thread;
//! - of those, the workers are the busy ones (each has run a share of every dispatch; the
//!   queue thread that hands out dispatches has run a small fraction of that);
//! - worker `i` is pinned to the `i`-th CPU this process may use, when there are at least
//!   as many CPUs as workers. Anything unexpected (another OS, fewer CPUs, a failed call)
//!   leaves the threads as they were.
//!
//! `TANDEM_WGPU_PIN=0` turns it off.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// Threads of this process, by id.
pub(crate) fn threads() -> BTreeSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return BTreeSet::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

fn read_task(tid: i32, file: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}")).ok()
}

/// CPU time a thread has run, in ns.
fn cpu_ns(tid: i32) -> Option<u64> {
    read_task(tid, "schedstat")?.split_whitespace().next()?.parse().ok()
}

/// Dispatches recorded before the workers are picked: enough that each has run many.
const PIN_AFTER_DISPATCHES: u64 = 500;

pub(crate) struct WorkerPin {
    /// Threads that appeared while the device opened, render and cache threads left out.
    candidates: Vec<i32>,
    done: AtomicBool,
}

impl WorkerPin {
    /// After the device opened: the driver's threads are those not in `before`.
    pub fn new(before: &BTreeSet<i32>) -> Option<WorkerPin> {
        if std::env::var("TANDEM_WGPU_PIN").is_ok_and(|v| v == "0") {
            return None;
        }
        let candidates: Vec<i32> = threads()
            .difference(before)
            .copied()
            .filter(|&t| read_task(t, "comm").is_some_and(|c| !c.starts_with("llvmpipe-") && !c.contains("disk$")))
            .collect();
        (candidates.len() >= 2).then(|| WorkerPin { candidates, done: AtomicBool::new(false) })
    }

    /// Called after waits with the dispatches recorded so far; pins once, past the threshold.
    pub fn maybe_pin(&self, dispatches: u64) {
        if dispatches < PIN_AFTER_DISPATCHES || self.done.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut busy: Vec<(u64, i32)> = self.candidates.iter().filter_map(|&t| Some((cpu_ns(t)?, t))).collect();
        busy.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&(top, _)) = busy.first() else { return };
        // Workers each ran a share of every dispatch; the queue thread a small fraction of one.
        let workers: Vec<i32> = busy.iter().filter(|(ns, _)| *ns * 4 >= top).map(|&(_, t)| t).collect();
        let cpus = allowed_cpus();
        if workers.len() < 2 || cpus.len() < workers.len() {
            tracing::debug!(workers = workers.len(), cpus = cpus.len(), "lavapipe workers left unpinned");
            return;
        }
        for (&t, &cpu) in workers.iter().zip(&cpus) {
            if !pin(t, cpu) {
                tracing::debug!(thread = t, cpu, "pinning a lavapipe worker failed");
                return;
            }
        }
        tracing::debug!(?workers, ?cpus, "lavapipe workers pinned, one per CPU");
    }
}

#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![];
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

#[cfg(target_os = "linux")]
fn pin(tid: i32, cpu: usize) -> bool {
    // SAFETY: as above; sched_setaffinity only reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Vec<usize> {
    vec![]
}

#[cfg(not(target_os = "linux"))]
fn pin(_tid: i32, _cpu: usize) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn affinity_of(tid: i32) -> Vec<usize> {
        // SAFETY: as in allowed_cpus.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
        }
    }

    /// Two busy "workers", a busy render thread and an idle thread appear after the snapshot:
    /// the two workers get a CPU each, the others keep the process's CPUs.
    #[test]
    fn busy_new_threads_are_pinned_one_per_cpu() {
        let cpus = allowed_cpus();
        if cpus.len() < 2 {
            tandem_core::skip::note(format!("affinity: pinning needs 2 CPUs, this process may use {}", cpus.len()));
            return;
        }
        let before = threads();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let spawn = |name: &'static str, busy: bool| {
            let (stop, tx) = (stop.clone(), tx.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tx.send((name, unsafe { libc::gettid() })).unwrap();
                    let t0 = std::time::Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if !busy || t0.elapsed().as_millis() > 300 {
                            std::thread::sleep(std::time::Duration::from_millis(5));
                        }
                    }
                })
                .unwrap()
        };
        let handles = [spawn("worker-a", true), spawn("worker-b", true), spawn("llvmpipe-0", true), spawn("idle", false)];
        let tids: std::collections::HashMap<&str, i32> = (0..4).map(|_| rx.recv().unwrap()).collect();
        std::thread::sleep(std::time::Duration::from_millis(350));
        let pin = WorkerPin::new(&before).expect("new threads seen");
        pin.maybe_pin(PIN_AFTER_DISPATCHES - 1);
        assert!(tids.values().all(|&t| affinity_of(t) == cpus), "pinned before the threshold");
        pin.maybe_pin(PIN_AFTER_DISPATCHES);
        let by_name: std::collections::HashMap<&str, Vec<usize>> = tids.iter().map(|(&n, &t)| (n, affinity_of(t))).collect();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let (a, b) = (&by_name["worker-a"], &by_name["worker-b"]);
        assert_eq!(a.len(), 1, "worker-a pinned to one CPU: {a:?}");
        assert_eq!(b.len(), 1, "worker-b pinned to one CPU: {b:?}");
        assert_ne!(a, b, "the workers share a CPU");
        assert_eq!(by_name["llvmpipe-0"], cpus, "a render thread was pinned");
        assert_eq!(by_name["idle"], cpus, "an idle thread was pinned");
    }
}
