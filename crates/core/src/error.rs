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
}
