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
//! - of those, the workers are the busy ones over a window of a few hundred dispatches (each
//!   runs a share of every dispatch; the queue thread that hands dispatches out runs a small
//!   fraction of that, except while it JIT-compiles new shader variants, so a window without a
//!   clear split is followed by another);
//! - worker `i` is pinned to the `i`-th CPU this process may use, when there are at least
//!   as many CPUs as workers. Anything unexpected (another OS, fewer CPUs, a failed call)
//!   leaves the threads as they were.
//!
//! `TANDEM_WGPU_PIN=0` turns it off.

use std::collections::BTreeSet;
use std::sync::Mutex;

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

/// Dispatches recorded before the workers are first looked at, and the window over which
/// their CPU time is compared.
const PIN_AFTER_DISPATCHES: u64 = 300;
const WINDOW_DISPATCHES: u64 = 300;
/// Windows tried before giving up (a window where the queue thread compiles shaders shows no
/// clear split; a later one does).
const MAX_WINDOWS: u32 = 8;

enum State {
    Waiting,
    /// CPU time of each candidate when the window opened, at `at` dispatches.
    Measuring {
        at: u64,
        cpu: Vec<(i32, u64)>,
        windows: u32,
    },
    Done,
}

pub(crate) struct WorkerPin {
    /// Threads that appeared while the device opened, render and cache threads left out.
    candidates: Vec<i32>,
    state: Mutex<State>,
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
        (candidates.len() >= 2).then(|| WorkerPin { candidates, state: Mutex::new(State::Waiting) })
    }

    fn snapshot(&self) -> Vec<(i32, u64)> {
        self.candidates.iter().filter_map(|&t| Some((t, cpu_ns(t)?))).collect()
    }

    /// Called before waits with the dispatches recorded so far. Past the threshold it opens a
    /// window; at the window's end it compares each candidate's CPU time over the window and
    /// pins the workers when they stand clearly apart (see `workers`), else opens another.
    pub fn maybe_pin(&self, dispatches: u64) {
        let Ok(mut state) = self.state.try_lock() else { return };
        match &*state {
            State::Done => {}
            State::Waiting if dispatches >= PIN_AFTER_DISPATCHES => {
                *state = State::Measuring { at: dispatches, cpu: self.snapshot(), windows: 1 }
            }
            State::Waiting => {}
            State::Measuring { at, cpu, windows } if dispatches >= at + WINDOW_DISPATCHES => {
                let now = self.snapshot();
                let deltas: Vec<(i32, u64)> = now
                    .iter()
                    .filter_map(|&(t, ns)| Some((t, ns.saturating_sub(cpu.iter().find(|(u, _)| *u == t)?.1))))
                    .collect();
                match workers(deltas) {
                    Some(w) => {
                        pin_all(&w);
                        *state = State::Done;
                    }
                    None if *windows >= MAX_WINDOWS => {
                        tracing::debug!("lavapipe workers not told apart; left unpinned");
                        *state = State::Done;
                    }
                    None => *state = State::Measuring { at: dispatches, cpu: now, windows: windows + 1 },
                }
            }
            State::Measuring { .. } => {}
        }
    }
}

/// The workers among the candidates, from their CPU time over a window: the busiest ones,
/// each at least 4x any other (workers run a share of every dispatch; the queue thread only
/// hands dispatches out, unless it is compiling shaders), at least 2 of them.
fn workers(mut deltas: Vec<(i32, u64)>) -> Option<Vec<i32>> {
    deltas.sort_unstable_by_key(|&(_, ns)| std::cmp::Reverse(ns));
    let split = (1..deltas.len()).find(|&i| deltas[i].1.saturating_mul(4) <= deltas[i - 1].1)?;
    let w: Vec<i32> = deltas[..split].iter().map(|&(t, _)| t).collect();
    // Workers share dispatches evenly: the least busy has at least half the busiest's time.
    (w.len() >= 2 && deltas[split - 1].1 * 2 >= deltas[0].1).then_some(w)
}

fn pin_all(workers: &[i32]) {
    let cpus = allowed_cpus();
    if cpus.len() < workers.len() {
        tracing::debug!(workers = workers.len(), cpus = cpus.len(), "more lavapipe workers than CPUs; left unpinned");
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

#[cfg(test)]
mod split_tests {
    use super::workers;

    #[test]
    fn workers_are_the_busy_threads_standing_clearly_apart() {
        // Two workers and a queue thread handing out dispatches.
        assert_eq!(workers(vec![(3, 10), (1, 100), (2, 95)]), Some(vec![1, 2]));
        // The queue thread compiling shaders: no clear split, look again later.
        assert_eq!(workers(vec![(1, 100), (2, 98), (3, 90)]), None);
        assert_eq!(workers(vec![(1, 100), (2, 60), (3, 20)]), None);
        // One busy thread is not a pool of workers.
        assert_eq!(workers(vec![(1, 100), (2, 10)]), None);
        // Four workers, two idle threads.
        assert_eq!(workers(vec![(1, 90), (2, 100), (3, 80), (4, 95), (5, 3), (6, 0)]), Some(vec![2, 4, 1, 3]));
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn affinity_of(tid: i32) -> Vec<usize> {
        // SAFETY: as in allowed_cpus.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
        }
    }

    /// Two busy "workers", a busy render thread, a mostly idle "queue" thread and an idle
    /// thread appear after the snapshot: the two workers get a CPU each, the others keep the
    /// process's CPUs.
    #[test]
    fn busy_new_threads_are_pinned_one_per_cpu() {
        let cpus = allowed_cpus();
        if cpus.len() < 2 {
            tandem_core::skip::note(format!("affinity: pinning needs 2 CPUs, this process may use {}", cpus.len()));
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        // `duty`: spin this many ms out of every 10.
        let spawn = |name: &'static str, duty: u64| {
            let (stop, tx) = (stop.clone(), tx.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tx.send((name, unsafe { libc::gettid() })).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = std::time::Instant::now();
                        while t0.elapsed().as_millis() < duty as u128 {
                            std::hint::spin_loop();
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10 - duty));
                    }
                })
                .unwrap()
        };
        let handles =
            [spawn("worker-a", 9), spawn("worker-b", 9), spawn("llvmpipe-0", 9), spawn("queue", 0), spawn("idle", 0)];
        let tids: std::collections::HashMap<&str, i32> = (0..5).map(|_| rx.recv().unwrap()).collect();
        // "New" means these five: other tests run in this process at the same time, and a busy
        // thread of theirs started after a snapshot would be a third worker for two CPUs.
        let before: BTreeSet<i32> = threads().into_iter().filter(|t| !tids.values().any(|v| v == t)).collect();
        let pin = WorkerPin::new(&before).expect("new threads seen");
        pin.maybe_pin(PIN_AFTER_DISPATCHES - 1);
        pin.maybe_pin(PIN_AFTER_DISPATCHES);
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert!(tids.values().all(|&t| affinity_of(t) == cpus), "pinned before the window closed");
        pin.maybe_pin(PIN_AFTER_DISPATCHES + WINDOW_DISPATCHES);
        let by_name: std::collections::HashMap<&str, Vec<usize>> =
            tids.iter().map(|(&n, &t)| (n, affinity_of(t))).collect();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let (a, b) = (&by_name["worker-a"], &by_name["worker-b"]);
        assert_eq!(a.len(), 1, "worker-a pinned to one CPU: {a:?}");
        assert_eq!(b.len(), 1, "worker-b pinned to one CPU: {b:?}");
        assert_ne!(a, b, "the workers share a CPU");
        for other in ["llvmpipe-0", "queue", "idle"] {
            assert_eq!(by_name[other], cpus, "{other} was pinned");
        }
    }
}
