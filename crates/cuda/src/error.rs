//! Errors of driver calls: which codes leave the CUDA context unusable, and the messages.

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use tandem_core::Error;

/// The message when no driver is present; tests assert it.
pub const NO_DRIVER: &str = "no CUDA driver found (libcuda.so); use --backend wgpu or --backend reference";

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::backend("cuda", msg)
}

pub(crate) fn drv(what: &str) -> impl Fn(DriverError) -> Error + '_ {
    move |e| driver_error(what, e.0, &format!("{e:?}"))
}

/// Driver results after which the context is unusable: every later call on it fails (or, for
/// memory the fault corrupted, returns garbage) until the process exits. CUDA documents these
/// as "the context cannot be used ... all existing device memory allocations are invalid";
/// CUDA_ERROR_UNKNOWN is counted with them because after a kernel nothing proves the context
/// sound, and serving from it would risk wrong tokens rather than an error.
pub(crate) fn is_sticky(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_NVLINK_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_DEVICE_UNAVAILABLE
            | CUDA_ERROR_DEINITIALIZED
            | CUDA_ERROR_EXTERNAL_DEVICE
            | CUDA_ERROR_UNKNOWN
    )
}

/// Our error for a failed driver call `what` (the op and, for a launch, the kernel). A sticky
/// code is [`Error::DeviceLost`], so the engine stops instead of serving from a dead context;
/// without TANDEM_CUDA_SYNC=1 an asynchronous fault surfaces at a later call (often the copy
/// to host), so the message says how to pin it to the kernel that raised it.
pub(crate) fn driver_error(what: &str, code: CUresult, detail: &str) -> Error {
    if is_sticky(code) {
        Error::device_lost("cuda", format!("{what}: {detail} ({code:?}); the CUDA context is unusable, restart the server (TANDEM_CUDA_SYNC=1 reports a fault against the kernel that raised it)"))
    } else {
        err(format!("{what}: {detail}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sticky codes stop the engine; the others fail one call. Built from codes, not from a
    /// live driver (formatting a DriverError asks libcuda for its text).
    #[test]
    fn sticky_codes_are_fatal_and_named_by_op() {
        use CUresult::*;
        for code in [
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_LAUNCH_FAILED,
            CUDA_ERROR_ECC_UNCORRECTABLE,
            CUDA_ERROR_MISALIGNED_ADDRESS,
            CUDA_ERROR_ILLEGAL_INSTRUCTION,
            CUDA_ERROR_ASSERT,
            CUDA_ERROR_HARDWARE_STACK_ERROR,
            CUDA_ERROR_CONTEXT_IS_DESTROYED,
        ] {
            let e = driver_error("launching rms_norm_bf16", code, "an illegal memory access was encountered");
            assert!(e.is_fatal(), "{code:?} must be fatal");
            let m = e.to_string();
            assert!(
                m.contains("launching rms_norm_bf16") && m.contains(&format!("{code:?}")) && m.contains("restart"),
                "{m}"
            );
        }
        for code in [
            CUDA_ERROR_OUT_OF_MEMORY,
            CUDA_ERROR_INVALID_VALUE,
            CUDA_ERROR_NOT_FOUND,
            CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            CUDA_ERROR_INVALID_PTX,
            CUDA_ERROR_NO_BINARY_FOR_GPU,
        ] {
            let e = driver_error("matmul: x scratch of 64 bytes", code, "detail");
            assert!(!e.is_fatal(), "{code:?} must not stop the engine");
            assert!(e.to_string().contains("matmul: x scratch of 64 bytes"), "{e}");
        }
    }
}
