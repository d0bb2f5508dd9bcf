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
    #[error("could not parse {what} TOML: {message}")]
    Toml {
        /// What the document was meant to describe ("cluster", "model", ...).
        what: &'static str,
        /// The parser's message, with line, column and a window of the
        /// line ([`polychip_files::toml_error`]).
        message: String,
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
    #[error("{}: {source}", polychip_files::shown_path(path))]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<SpecError>,
    },
    /// A file holds more values than any input of the planner has.
    #[error(
        "{}: holds more than {} values (counted by their separators), more than any cluster, \
         model, settings, plan or profile file has",
        polychip_files::shown_path(path),
        polychip_files::MAX_JSON_VALUES
    )]
    TooManyValues {
        /// The file.
        path: PathBuf,
    },
    /// A plan to evaluate is inconsistent with the model or the cluster.
    #[error("plan: {0}")]
    Plan(String),
    /// What is wrong in a runs file (`polychip plan --score`), naming the
    /// run; the file is named around it ([`SpecError::InFile`]).
    #[error("{0}")]
    Runs(String),
    /// What is wrong with a plan file, read or evaluated: `plan FILE: ...`
    /// whichever of the two found it (until stop 45 a file's own errors
    /// read `plan: FILE: ...` and its evaluation's `plan FILE: ...`).
    #[error("plan {}: {message}", polychip_files::shown_path(path))]
    PlanFile {
        /// The plan file.
        path: PathBuf,
        /// What is wrong, as [`SpecError::Plan`] says it.
        message: String,
    },
}

impl SpecError {
    /// This error said of the plan file `path`: a [`SpecError::Plan`]
    /// becomes a [`SpecError::PlanFile`]; any other is as it was.
    pub fn of_plan_file(self, path: &std::path::Path) -> SpecError {
        match self {
            SpecError::Plan(message) => SpecError::PlanFile {
                path: path.to_path_buf(),
                message,
            },
            e => e,
        }
    }
}

/// Reads a whole file ([`read_text_file`]), naming it in the error, and
/// refuses one with more separators (`{[,=:`, an upper bound on the values
/// of a TOML or JSON document) than [`polychip_files::MAX_JSON_VALUES`]:
/// parsing builds a tree of some 100 bytes a value, so a 64 MiB file of
/// empty tables would take gigabytes before any check of what it says.
pub(crate) fn read_file(path: &std::path::Path) -> Result<String, SpecError> {
    let text = read_text_file(path, MAX_TEXT_FILE).map_err(|source| SpecError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let separators = text.bytes().filter(|b| b"{[,=:".contains(b)).count();
    if separators > polychip_files::MAX_JSON_VALUES {
        return Err(SpecError::TooManyValues {
            path: path.to_path_buf(),
        });
    }
    Ok(text)
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
        let dir = std::env::temp_dir().join(format!("polychip-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let nested = dir.join("nested.json");
        std::fs::write(&nested, "{\"a\":{},".repeat(600_000)).unwrap();
        let err = read_file(&nested).unwrap_err().to_string();
        assert!(
            err.contains("nested.json: holds more than 1048576 values"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
