use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("wrong shape: {0}")]
    Shape(String),
    #[error("non-finite values in {0}")]
    NonFinite(String),
    #[error("malformed payload: {0}")]
    Malformed(String),
    #[error("unsupported wire version {found} (this build speaks {supported})")]
    Version { found: u8, supported: u8 },
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
    #[error("dataset: {0}")]
    Data(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error("model config: {0}")]
    Config(String),
    #[error("contribution is not signed by the member it names")]
    Signature,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<cohort_program::codec::CodecError> for EngineError {
    fn from(_: cohort_program::codec::CodecError) -> Self {
        EngineError::Malformed("truncated".into())
    }
}
