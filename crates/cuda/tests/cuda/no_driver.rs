//! Without libcuda, `CudaBackend::new` must return the documented error, not panic. With a
//! driver (a GPU machine), it must not claim the driver is missing.

use tandem_cuda::CudaBackend;
use tandem_cuda::NO_DRIVER;

fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[test]
fn new_reports_a_missing_driver_clearly() {
    let present = driver_present();
    let res = std::panic::catch_unwind(|| CudaBackend::new(0).map(|_| ()));
    let res = res.expect("CudaBackend::new panicked; it must return an error");
    match (present, res) {
        (false, Err(e)) => {
            assert_eq!(e.to_string(), format!("backend cuda: {NO_DRIVER}"));
            println!("no CUDA driver here; CudaBackend::new said: {e}");
        }
        (false, Ok(())) => panic!("no libcuda on the loader path, yet CudaBackend::new succeeded"),
        (true, Err(e)) => {
            assert!(!e.to_string().contains(NO_DRIVER), "driver present but reported missing: {e}");
            println!("driver present; CudaBackend::new failed for another reason (allowed here, the ops test requires success): {e}");
        }
        (true, Ok(())) => println!("driver present; CudaBackend::new(0) succeeded"),
    }
}

#[test]
fn a_bad_ordinal_is_an_error_not_a_panic() {
    let res = std::panic::catch_unwind(|| CudaBackend::new(10_000).map(|_| ()));
    assert!(res.expect("CudaBackend::new(10000) panicked").is_err());
}
