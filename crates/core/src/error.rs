use std::path::PathBuf;

/// Errors a user can act on: each names the file, the tensor or the field, and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{path}: tensor `{tensor}`: {msg}")]
    Tensor { path: PathBuf, tensor: String, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("backend {backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The device can no longer be used (a sticky CUDA error: illegal address, launch
    /// failure, ECC...): every later call on its context fails or returns garbage. Whoever
    /// gets it must stop using the model, not retry ([`Error::is_fatal`]).
    #[error("backend {backend}: device lost: {msg}")]
    DeviceLost { backend: &'static str, msg: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn config(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Config { path: path.into(), msg: msg.into() }
    }
    pub fn tensor(path: impl Into<PathBuf>, tensor: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Tensor { path: path.into(), tensor: tensor.into(), msg: msg.into() }
    }
    pub fn backend(backend: &'static str, msg: impl Into<String>) -> Self {
        Error::Backend { backend, msg: msg.into() }
    }
    pub fn device_lost(backend: &'static str, msg: impl Into<String>) -> Self {
        Error::DeviceLost { backend, msg: msg.into() }
    }
    /// True when nothing more can run on this model: the engine stops instead of failing
    /// one batch and going on.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::DeviceLost { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_device_is_fatal() {
        let lost = Error::device_lost("cuda", "launching rms_norm_bf16: CUDA_ERROR_ILLEGAL_ADDRESS");
        assert!(lost.is_fatal());
        assert!(lost.to_string().contains("device lost") && lost.to_string().contains("rms_norm_bf16"), "{lost}");
        assert!(!Error::backend("cuda", "allocating 4 bytes: CUDA_ERROR_OUT_OF_MEMORY").is_fatal());
        assert!(!Error::Batch("empty batch".into()).is_fatal());
    }
}
