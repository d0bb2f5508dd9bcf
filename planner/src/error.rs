//! The errors of reading and checking the planner's inputs: model shapes,
//! cluster files, `polychip devices --json` output and training settings.
//! Each message is a sentence that names the offending field and value.

use std::path::PathBuf;

/// Why an input (model, cluster, settings) was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A file could not be read.
    #[error("could not read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A TOML document did not parse or did not match the expected shape.
    #[error("could not parse {what} TOML: {source}")]
    Toml {
        /// What the document was meant to describe ("cluster", "model", ...).
        what: &'static str,
        /// The parser's message, with line and column.
        source: toml::de::Error,
    },
    /// A model shape is inconsistent.
    #[error("model \"{model}\": {problem}")]
    Model {
        /// The model's name.
        model: String,
        /// What is wrong, naming the field and its value.
        problem: String,
    },
    /// No preset has this name.
    #[error(
        "there is no model preset named \"{0}\" (known: llama-7b, llama-13b, llama-70b, h2-100b)"
    )]
    UnknownPreset(String),
    /// A chip type in a cluster is inconsistent.
    #[error("chip type \"{chip}\": {problem}")]
    Chip {
        /// The chip type's name.
        chip: String,
        /// What is wrong, naming the field and its value.
        problem: String,
    },
    /// The cluster as a whole is inconsistent.
    #[error("cluster: {0}")]
    Cluster(String),
    /// `polychip devices --json` output lacks something.
    #[error("devices JSON: {0}")]
    DevicesJson(String),
    /// The training settings are inconsistent.
    #[error("training settings: {0}")]
    Settings(String),
    /// A profile file is unusable (or does not match the model planned).
    #[error("profile {0}")]
    Profile(String),
    /// Something wrong inside a file, which the message names first.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<SpecError>,
    },
    /// A plan to evaluate is inconsistent with the model or the cluster.
    #[error("plan: {0}")]
    Plan(String),
}

/// Reads a whole file ([`read_text_file`]), naming it in the error.
pub(crate) fn read_file(path: &std::path::Path) -> Result<String, SpecError> {
    read_text_file(path, MAX_TEXT_FILE).map_err(|source| SpecError::Io {
        path: path.to_path_buf(),
        source,
    })
}

use polychip_files::{MAX_TEXT_FILE, read_text_file};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_cannot_be_read_is_named() {
        let err = read_file(std::path::Path::new("/nonexistent/polychip/missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("could not read") && err.contains("missing.toml"),
            "{err}"
        );
        let err = read_file(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("a character device"), "{err}");
    }
}
