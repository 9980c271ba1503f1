//! The one error type of the library: every failure is a value, never a panic.

use tandem_engine::{InvalidParam, SubmitError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sampling parameter out of range; [`InvalidParam::field`] names it.
    #[error("invalid sampling parameter: {0}")]
    InvalidParam(#[from] InvalidParam),
    /// A builder setting the engine cannot run with (zero sizes, a block size it does not
    /// support, a name it does not know).
    #[error("{0}")]
    Config(String),
    /// Loading the model, its tokenizer or chat template, or tokenizing a prompt.
    #[error(transparent)]
    Model(#[from] tandem_core::Error),
    /// The engine refused prompt `index` of the call (too long for the context, larger than
    /// the KV pool, out-of-vocabulary ids, engine stopped).
    #[error("prompt {index}: {source}")]
    Refused { index: usize, source: SubmitError },
    /// A structured-output spec that does not compile (bad schema, regex or grammar), or a
    /// tokenizer llguidance cannot read.
    #[error(transparent)]
    Guide(#[from] tandem_structured::GuideError),
}

impl Error {
    /// The sampling parameter at fault, where that is what went wrong.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::InvalidParam(p) => Some(p.field),
            Error::Refused { source: SubmitError::InvalidParams(p), .. } => Some(p.field),
            _ => None,
        }
    }

    pub(crate) fn refused(index: usize, e: SubmitError) -> Error {
        match e {
            SubmitError::InvalidParams(p) => Error::InvalidParam(p),
            source => Error::Refused { index, source },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
