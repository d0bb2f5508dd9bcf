//! Training errors: each names the file, parameter, stage, rank or value that
//! is wrong (a file as [`polychip_files::shown_path`] shows it: escaped, and
//! cut after 200 characters).

use std::path::PathBuf;

/// Why training (or one of its inputs) failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A device, tensor or operator call failed in the host or a plugin.
    #[error(transparent)]
    Host(#[from] polychip_host::HostError),
    /// A collective or point-to-point transfer failed.
    #[error(transparent)]
    Comm(#[from] polychip_comm::CommError),
    /// A model or training configuration value is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The text corpus cannot be used.
    #[error("corpus {}: {message}", polychip_files::shown_path(path))]
    Data {
        /// The corpus file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A checkpoint is missing, corrupt or does not match the model.
    #[error("checkpoint {}: {message}", polychip_files::shown_path(path))]
    Checkpoint {
        /// The checkpoint file or directory.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The plan cannot run: a stage does not fit, ranks and stages disagree.
    #[error("plan: {0}")]
    Plan(String),
    /// The loss or the gradient norm stopped being finite.
    #[error("training diverged: {0}")]
    Diverged(String),
    /// A file could not be read or written.
    #[error("{}: {source}", polychip_files::shown_path(path))]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS's words.
        source: std::io::Error,
    },
}

/// Result of a training call.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TrainError {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}
