//! The training text: a byte-level corpus and deterministic batches.
//!
//! Tokens are bytes (vocabulary [`VOCAB`] = 256), so any file is a corpus.
//! The last [`VALIDATION_FRACTION`] of the bytes is the validation split and
//! the rest the training split, cut at one fixed byte. Each sequence of a
//! batch starts at a window chosen by a hash of (seed, split, step, index in
//! the global batch) alone, so however the global batch is divided among data
//! parallel ranks, every rank reads exactly the sequences a single process
//! would.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};

/// Tiny Shakespeare (public domain), bundled so that training needs no
/// download.
pub const BUNDLED: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt"));

/// The name [`Corpus::bundled`] gives as its source.
pub const BUNDLED_SOURCE: &str = "bundled Tiny Shakespeare";

/// Number of distinct tokens: one per byte value.
pub const VOCAB: usize = 256;

/// The share of the corpus, at its end, held out for validation.
pub const VALIDATION_FRACTION: f64 = 0.1;

/// The fewest bytes a corpus may hold: enough for each split to hold one
/// input byte and its target.
pub const MIN_BYTES: usize = 20;

/// The most bytes a corpus file may hold (4 GiB; the whole file is read
/// into memory).
pub const MAX_BYTES: usize = 1 << 32;

/// Which part of the corpus a batch is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The first 90 %, which the model trains on.
    Train,
    /// The last 10 %, used only to measure the loss.
    Validation,
}

impl Split {
    /// The lowercase name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Split::Train => "training",
            Split::Validation => "validation",
        }
    }

    /// A constant that separates the two splits' random streams.
    const fn tag(self) -> u64 {
        match self {
            Split::Train => 0x7472_6169_6e00_0001,
            Split::Validation => 0x7661_6c69_6400_0002,
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A byte-level text corpus split into training and validation bytes.
#[derive(Clone)]
pub struct Corpus {
    source: String,
    bytes: Vec<u8>,
    /// Index of the first validation byte.
    split_at: usize,
}

impl fmt::Debug for Corpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Corpus")
            .field("source", &self.source)
            .field("train_bytes", &self.split_at)
            .field("validation_bytes", &(self.bytes.len() - self.split_at))
            .finish()
    }
}

impl Corpus {
    /// The bundled Tiny Shakespeare text.
    pub fn bundled() -> Corpus {
        Corpus::from_bytes(BUNDLED_SOURCE, BUNDLED.to_vec())
            .expect("the bundled corpus is long enough")
    }

    /// Reads a file (any bytes; byte-level tokens, vocabulary 256).
    ///
    /// Fails with [`TrainError::Io`] when the file cannot be read and with
    /// [`TrainError::Data`] when it holds fewer than [`MIN_BYTES`] bytes.
    ///
    /// The file must be a regular file of at most [`MAX_BYTES`] bytes: a
    /// FIFO, a directory or a device (`/dev/zero`) is refused without
    /// blocking on it or reading it.
    pub fn load(path: &Path) -> Result<Corpus> {
        use std::io::Read;
        let fail = |message: String| TrainError::Data {
            path: path.to_path_buf(),
            message,
        };
        let mut open = std::fs::OpenOptions::new();
        open.read(true);
        #[cfg(unix)]
        {
            // Opening a FIFO for reading blocks until a writer comes: open
            // without blocking, then refuse anything but a regular file.
            use std::os::unix::fs::OpenOptionsExt;
            open.custom_flags(libc::O_NONBLOCK);
        }
        let file = open
            .open(path)
            .map_err(|e| fail(format!("cannot be read: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("cannot be read: {e}")))?;
        if !meta.is_file() {
            return Err(fail(format!(
                "is not a regular file (it is {}); give a text file",
                polychip_files::kind(meta.file_type())
            )));
        }
        if meta.len() > MAX_BYTES as u64 {
            return Err(fail(format!(
                "holds {} bytes, more than the {MAX_BYTES} a corpus may hold",
                meta.len()
            )));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(MAX_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(format!("cannot be read: {e}")))?;
        if bytes.len() > MAX_BYTES {
            return Err(fail(format!(
                "grew past the {MAX_BYTES} bytes a corpus may hold while it was read"
            )));
        }
        Corpus::from_bytes(&polychip_files::shown_path(path), bytes)
    }

    /// A corpus of `bytes`; `source` names it in messages (a path or a
    /// description). Fails with [`TrainError::Data`] for fewer than
    /// [`MIN_BYTES`] bytes.
    pub fn from_bytes(source: &str, bytes: Vec<u8>) -> Result<Corpus> {
        if bytes.len() < MIN_BYTES {
            return Err(TrainError::Data {
                path: PathBuf::from(source),
                message: format!(
                    "holds {}, but a corpus needs at least {MIN_BYTES} \
                     so that its training and validation splits each hold \
                     one byte and its successor",
                    byte_count(bytes.len())
                ),
            });
        }
        let validation = (bytes.len() as f64 * VALIDATION_FRACTION) as usize;
        let split_at = bytes.len() - validation;
        Ok(Corpus {
            source: source.to_string(),
            bytes,
            split_at,
        })
    }

    /// Where the corpus came from: a path or a description.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Bytes in `split`.
    pub fn len(&self, split: Split) -> usize {
        self.split(split).len()
    }

    /// Total bytes in both splits (never zero).
    pub fn total_len(&self) -> usize {
        self.bytes.len()
    }

    /// The bytes of `split`.
    pub fn split(&self, split: Split) -> &[u8] {
        match split {
            Split::Train => &self.bytes[..self.split_at],
            Split::Validation => &self.bytes[self.split_at..],
        }
    }

    /// Checks that both splits hold at least one window of `seq_len + 1`
    /// bytes (a sequence and the target of its last token); the error names
    /// the corpus, the split, its length and `seq_len`.
    pub fn check_seq_len(&self, seq_len: usize) -> Result<()> {
        if seq_len == 0 {
            return Err(TrainError::Config(
                "the sequence length must be at least 1 token".to_string(),
            ));
        }
        for split in [Split::Train, Split::Validation] {
            let len = self.len(split);
            if len <= seq_len {
                return Err(TrainError::Data {
                    path: PathBuf::from(&self.source),
                    message: format!(
                        "the {split} split holds {}, fewer than one window of \
                         seq_len + 1 = {} (seq_len {seq_len}); use a shorter \
                         sequence length or a longer corpus",
                        byte_count(len),
                        byte_count(seq_len + 1)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Where sequence `index` of the global batch of `step` starts in
    /// `split`: a pure function of (seed, split, step, index).
    ///
    /// # Panics
    /// If `split` holds no more than `seq_len` bytes (see
    /// [`Corpus::check_seq_len`]).
    pub fn window_start(
        &self,
        split: Split,
        seed: u64,
        step: u64,
        index: u64,
        seq_len: usize,
    ) -> usize {
        let len = self.len(split);
        assert!(
            seq_len > 0 && len > seq_len,
            "corpus {}: the {split} split holds {len} bytes, too few for \
             seq_len {seq_len} (call check_seq_len first)",
            self.source
        );
        let mut h = splitmix64(seed);
        h = splitmix64(h ^ split.tag());
        h = splitmix64(h ^ step);
        h = splitmix64(h ^ index);
        (h % (len - seq_len) as u64) as usize
    }

    /// Sequences `first..first + count` of the global batch of `step`
    /// (0-based), each `seq_len` tokens, as `(inputs, targets)`: both hold
    /// `count * seq_len` token ids, sequence after sequence, and each target
    /// is the byte after its input.
    ///
    /// Sequence `j` starts at [`Corpus::window_start`], so any partition of
    /// a batch over ranks sees the same data as the whole.
    ///
    /// # Panics
    /// If `split` holds no more than `seq_len` bytes (see
    /// [`Corpus::check_seq_len`]).
    pub fn batch(
        &self,
        split: Split,
        seed: u64,
        step: u64,
        first: usize,
        count: usize,
        seq_len: usize,
    ) -> (Vec<i32>, Vec<i32>) {
        let bytes = self.split(split);
        let mut inputs = Vec::with_capacity(count * seq_len);
        let mut targets = Vec::with_capacity(count * seq_len);
        for j in first..first + count {
            let start = self.window_start(split, seed, step, j as u64, seq_len);
            let window = &bytes[start..start + seq_len + 1];
            inputs.extend(window[..seq_len].iter().map(|&b| i32::from(b)));
            targets.extend(window[1..].iter().map(|&b| i32::from(b)));
        }
        (inputs, targets)
    }
}

/// SplitMix64's output function: a fast bijective mix of 64 bits.
/// `n` bytes as a message says it: "1 byte", "20 bytes".
fn byte_count(n: usize) -> String {
    match n {
        1 => "1 byte".into(),
        n => format!("{n} bytes"),
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
