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

/// What a file that is not a regular file is, in words (`a FIFO`), for
/// the messages that refuse it.
pub fn file_kind(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// The most bytes a text input may have (a model, cluster, settings,
/// profile or plan file: all of them kilobytes; a fleet's profile a few
/// megabytes).
pub const MAX_TEXT_FILE: u64 = 64 << 20;

/// Reads the text file `path` if it is a regular file of at most `max_len`
/// bytes. Anything else is refused before it is opened, so that a FIFO
/// named in its place cannot block and `/dev/zero` cannot fill the memory;
/// a file that grows past the bound while it is read is refused too. The
/// errors say what the path is (a directory, a FIFO, a device) or how long.
pub fn read_text_file(path: &std::path::Path, max_len: u64) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it is {}, not a regular file; it was not read",
                file_kind(meta.file_type())
            ),
        ));
    }
    let too_long = |what: String| {
        Error::new(
            ErrorKind::InvalidData,
            format!("{what} more than the {max_len} bytes such a file may have"),
        )
    };
    if meta.len() > max_len {
        return Err(too_long(format!("it is {} bytes long,", meta.len())));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max_len.saturating_add(1))
        .read_to_string(&mut text)?;
    if text.len() as u64 > max_len {
        return Err(too_long("it grew while it was read, to".into()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = std::env::temp_dir().join(format!("polychip-read-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.toml");
        std::fs::write(&file, "x = 1\n").unwrap();
        assert_eq!(read_text_file(&file, 6).unwrap(), "x = 1\n");
        let err = read_text_file(&file, 5).unwrap_err().to_string();
        assert!(err.contains("6 bytes long, more than the 5 bytes"), "{err}");
        let err = read_text_file(&dir, 100).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        // Refused without reading (a read would never end).
        let err = read_text_file(std::path::Path::new("/dev/zero"), 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a character device"), "{err}");
        // Refused without opening (an open would block for a writer).
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let err = read_text_file(&fifo, 100).unwrap_err().to_string();
            assert!(err.contains("a FIFO"), "{err}");
        }
        let err = read_file(&dir.join("missing")).unwrap_err().to_string();
        assert!(
            err.contains("could not read") && err.contains("missing"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
