//! The fault handler: a SIGSEGV or SIGBUS inside a kernel names the kernel and the address
//! before the process dies.

use std::sync::atomic::{AtomicPtr, Ordering};

/// The kernel running now, for the fault handler (a NUL-terminated name, or null).
pub(super) static RUNNING: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

static mut OLD_SEGV: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();
static mut OLD_BUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// On a fault inside a kernel, says which kernel and where before the process dies; any other
/// fault goes to the handler that was there before (Rust's stack-overflow report).
pub(super) fn install_fault_handler() {
    extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let name = RUNNING.load(Ordering::SeqCst);
        // SAFETY: async-signal-safe calls only (write, sigaction); the name is a C string that
        // outlives the kernel run.
        unsafe {
            if !name.is_null() {
                let addr = (*info).si_addr() as usize;
                let mut buf = [0u8; 256];
                let mut n = 0;
                let mut put = |s: &[u8]| {
                    for &b in s {
                        if n < buf.len() {
                            buf[n] = b;
                            n += 1;
                        }
                    }
                };
                put(b"fake-cuda: kernel ");
                put(std::ffi::CStr::from_ptr(name as *const libc::c_char).to_bytes());
                put(b" touched inaccessible memory at 0x");
                for k in (0..16).rev() {
                    put(&[b"0123456789abcdef"[(addr >> (4 * k)) & 15]]);
                }
                put(b" (past the end of an allocation, freed memory, or a bad pointer): CUDA_ERROR_ILLEGAL_ADDRESS on a GPU\n");
                libc::write(2, buf.as_ptr() as *const libc::c_void, n);
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                return;
            }
            let old = if sig == libc::SIGSEGV {
                (*std::ptr::addr_of!(OLD_SEGV)).assume_init()
            } else {
                (*std::ptr::addr_of!(OLD_BUS)).assume_init()
            };
            if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            } else if old.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(old.sa_sigaction);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(old.sa_sigaction);
                f(sig);
            }
        }
    }
    // SAFETY: installs a handler; the old ones are saved first, once (the state is created once).
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGSEGV, &act, (*std::ptr::addr_of_mut!(OLD_SEGV)).as_mut_ptr());
        libc::sigaction(libc::SIGBUS, &act, (*std::ptr::addr_of_mut!(OLD_BUS)).as_mut_ptr());
    }
}
