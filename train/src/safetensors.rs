//! Checkpoints in the safetensors format, read and written with Hugging
//! Face's `safetensors` crate.
//!
//! A file is: an 8-byte little-endian `u64` N; N bytes of UTF-8 JSON, padded
//! with spaces to a multiple of 8, mapping each tensor name to
//! `{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}` (offsets
//! relative to the first byte after the header), plus an optional
//! `"__metadata__"` object of strings; then the data: every tensor
//! little-endian and row-major, packed with no gaps.
//!
//! Why the crate: it is the format's reference implementation, the one
//! behind the `safetensors` Python package that transformers and PyTorch
//! users load with. Using it for the layout (the order and offsets of the
//! data, the header's padding) and for the validation of what we read (the
//! framing, the 100 MB header bound, offsets that tile the data section from
//! its first byte to its last, sizes that match dtype x shape, arithmetic
//! overflow) means that the files we write are the files the ecosystem
//! reads, and that we accept exactly the files it accepts. Around it this
//! module adds what the crate does not do: a CRC-64 of the data section
//! under [`CHECKSUM_KEY`] in the metadata (a file carrying that key is
//! refused when its data does not match; one without it, from another
//! writer, is accepted), the dtypes polychip computes in, a header whose
//! bytes depend only on the contents (the crate's metadata map has no fixed
//! order), an atomic and durable [`SafeTensors::save`], and error messages
//! that name the file and say exactly what is wrong: when the crate refuses
//! a file, `explain` looks at the header again to name the tensor and the
//! fault, and falls back to the crate's own words.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use polychip_host::DType;
use safetensors::tensor::{Dtype, Metadata, SafeTensorError, TensorView};
use serde_json::{Map, Value};

use crate::error::{Result, TrainError};
use crate::files::{self, Links};

/// Metadata key holding the CRC-64/XZ of the whole file (16 hex digits,
/// counted as `0` while computing it): the length, the header (every name,
/// dtype, shape, offset and metadata entry) and the data. Every file
/// polychip writes has it; a checkpoint's file without it is refused.
pub const CHECKSUM_KEY: &str = "polychip.file_crc64";

/// The key earlier versions wrote: a CRC-64 of the data section only. A
/// file from another writer (a Hugging Face import) that has it is checked
/// against it; a checkpoint needs [`CHECKSUM_KEY`].
pub const LEGACY_CHECKSUM_KEY: &str = "polychip.crc64";

/// How [`CHECKSUM_KEY`] and its value begin in the header's bytes.
pub const SEAL_PREFIX: &[u8] = b"\"polychip.file_crc64\":\"";

/// The largest header we accept, the `safetensors` crate's own bound:
/// anything larger is a corrupt length.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The most characters a name in a header (a tensor's, a field's, a
/// metadata key) may have: a LLaMA tensor's is some 40, a polychip part's
/// some 60. A longer one is refused before any message quotes it (a
/// 100,000-character name was echoed whole into the refusal).
pub const MAX_NAME: usize = 256;

/// One tensor of a checkpoint: its element type, shape and raw
/// little-endian, row-major bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<i64>,
    /// `numel * dtype.size()` bytes.
    pub data: Vec<u8>,
}

/// The contents of a safetensors file: named tensors and string metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SafeTensors {
    /// Tensors by name.
    pub tensors: BTreeMap<String, StoredTensor>,
    /// Free-form metadata. [`CHECKSUM_KEY`] is set when saving and removed
    /// (after checking it) when loading.
    pub metadata: BTreeMap<String, String>,
}

/// The safetensors name of a dtype.
fn dtype_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F64 => "F64",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

/// The crate's dtype of ours.
fn to_crate(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F64 => Dtype::F64,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

/// Ours of the crate's dtype, if polychip supports it.
fn from_crate(dtype: Dtype) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| to_crate(d) == dtype)
}

/// The message for a dtype polychip does not read.
fn unknown_dtype(name: &str, tag: &dyn std::fmt::Display) -> String {
    let known: Vec<&str> = DType::ALL.into_iter().map(dtype_tag).collect();
    format!(
        "tensor `{name}` has dtype {tag}, which polychip does not read (known: {})",
        known.join(", ")
    )
}

/// Elements in a tensor of `shape`, or `None` for a negative dimension or an
/// overflow.
fn numel(shape: &[i64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
}

/// Bytes of a tensor of `dtype` and `shape`, or `None` as for [`numel`].
fn byte_len(dtype: DType, shape: &[i64]) -> Option<u64> {
    numel(shape)?.checked_mul(dtype.size() as u64)
}

/// A shape as `[2, 3]`.
pub fn show_shape(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

const CRC64_TABLE: [u64; 256] = {
    // ECMA-182 polynomial, bit-reflected.
    const POLY: u64 = 0xc96c_5795_d787_0f42;
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u64;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-64/XZ (ECMA-182 polynomial, reflected, initial value and final xor
/// all ones) of `bytes`; its check value, of `b"123456789"`, is
/// `0x995dc9bbdf1939fa`.
pub fn crc64(bytes: &[u8]) -> u64 {
    !crc64_update(!0, bytes)
}

/// Continues a CRC-64/XZ over more bytes (`state` starts at `!0`; the CRC is
/// `!state` at the end).
pub(crate) fn crc64_update(mut crc: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        crc = CRC64_TABLE[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

impl SafeTensors {
    /// No tensors and no metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) tensor `name`; fails, naming it, when its byte
    /// length is not `numel * dtype.size()` or a dimension is negative.
    pub fn insert(&mut self, name: impl Into<String>, t: StoredTensor) -> Result<()> {
        let name = name.into();
        check_tensor(&name, &t)?;
        self.tensors.insert(name, t);
        Ok(())
    }

    /// Serializes to safetensors bytes: the data laid out by the
    /// `safetensors` crate, the header written in a fixed order (so equal
    /// contents give equal bytes) with the metadata plus [`CHECKSUM_KEY`],
    /// padded with spaces to a multiple of 8.
    ///
    /// # Panics
    ///
    /// If a tensor was put into [`SafeTensors::tensors`] directly (not by
    /// [`SafeTensors::insert`]) with a byte length its shape does not have;
    /// [`SafeTensors::save`] checks first and returns an error instead.
    pub fn to_bytes(&self) -> Vec<u8> {
        let views = self.tensors.iter().map(|(name, t)| {
            let shape: Vec<usize> = t
                .shape
                .iter()
                .map(|&d| usize::try_from(d).expect("dimensions are checked by insert"))
                .collect();
            let view = TensorView::new(to_crate(t.dtype), shape, &t.data)
                .unwrap_or_else(|e| panic!("tensor `{name}` was not checked by insert: {e}"));
            (name.as_str(), view)
        });
        let raw = safetensors::serialize(views, None)
            .unwrap_or_else(|e| panic!("safetensors could not lay out the tensors: {e}"));
        let n = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")) as usize;
        let (header, data) = raw[8..].split_at(n);
        let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(header) else {
            unreachable!("the safetensors crate writes a JSON object");
        };
        // The metadata first, sorted, then the tensors in the crate's order
        // (the data's order); serde_json keeps either order deterministic.
        let mut metadata: Map<String, Value> = self
            .metadata
            .iter()
            .filter(|(k, _)| k.as_str() != CHECKSUM_KEY && k.as_str() != LEGACY_CHECKSUM_KEY)
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        metadata.insert(CHECKSUM_KEY.into(), "0".repeat(files::SEAL_DIGITS).into());
        let mut out_header = Map::new();
        out_header.insert("__metadata__".into(), Value::Object(metadata));
        out_header.extend(entries.into_iter().filter(|(k, _)| k != "__metadata__"));
        let mut json = Value::Object(out_header).to_string().into_bytes();
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let mut out = Vec::with_capacity(8 + json.len() + data.len());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(data);
        files::seal(&mut out, SEAL_PREFIX);
        out
    }

    /// Writes the file atomically ([`polychip_files::write_atomic`]: to
    /// `.<name>.tmp-<pid>` beside it, synced, renamed over `path`, then the
    /// directory synced). A failed save leaves any earlier file at `path`
    /// intact and removes its temporary file.
    pub fn save(&self, path: &Path) -> Result<()> {
        for (name, t) in &self.tensors {
            check_tensor(name, t)?;
        }
        polychip_files::write_atomic(path, &self.to_bytes()).map_err(|e| TrainError::io(path, e))
    }

    /// Reads a file written by [`SafeTensors::save`] or any safetensors
    /// writer (a regular file: a FIFO or device is refused unread).
    pub fn load(path: &Path) -> Result<SafeTensors> {
        let bytes = files::read_regular(path, Links::Follow, u64::MAX)?;
        SafeTensors::from_bytes(path, &bytes)
    }

    /// Reads a file polychip wrote (a checkpoint's stage file): a regular
    /// file, not a symbolic link, of exactly `expected_len` bytes, carrying
    /// [`CHECKSUM_KEY`] and matching it; the checksum is checked before
    /// anything of the file is parsed (a foreign file is refused without
    /// quoting it). Returns the tensors and the checksum.
    pub fn load_sealed(path: &Path, expected_len: u64) -> Result<(SafeTensors, u64)> {
        let bytes = files::read_regular(path, Links::Refuse, expected_len)?;
        if bytes.len() as u64 != expected_len {
            return Err(TrainError::Checkpoint {
                path: path.to_path_buf(),
                message: format!(
                    "is {} bytes long but its manifest says {expected_len} (truncated?)",
                    bytes.len()
                ),
            });
        }
        SafeTensors::from_sealed_bytes(path, &bytes)
    }

    /// [`SafeTensors::from_bytes`] of a file that must carry
    /// [`CHECKSUM_KEY`]: its checksum is checked first, over all of
    /// `bytes`. Returns the tensors and the checksum.
    pub fn from_sealed_bytes(path_for_errors: &Path, bytes: &[u8]) -> Result<(SafeTensors, u64)> {
        let fail = |message: String| TrainError::Checkpoint {
            path: PathBuf::from(path_for_errors),
            message,
        };
        let crc = match header_seal(bytes) {
            Ok(Some(seal)) => check_sealed(bytes, seal).map(|()| seal.recorded),
            Ok(None) => Err(files::missing_seal(
                &bytes[..header_end(bytes)],
                SEAL_PREFIX,
            )),
            Err(m) => Err(m),
        }
        .map_err(fail)?;
        Ok((SafeTensors::from_bytes(path_for_errors, bytes)?, crc))
    }

    /// Parses safetensors bytes with the `safetensors` crate, refusing every
    /// corruption with [`TrainError::Checkpoint`] naming `path_for_errors`,
    /// and then the dtypes polychip does not read and a data section that
    /// does not match the recorded checksum.
    pub fn from_bytes(path_for_errors: &Path, bytes: &[u8]) -> Result<SafeTensors> {
        let fail = |message: String| TrainError::Checkpoint {
            path: PathBuf::from(path_for_errors),
            message,
        };
        // Before the crate, which keeps one of two same-named entries.
        if let Some(m) = duplicate_key(bytes.get(8..header_end(bytes)).unwrap_or(&[])) {
            return Err(fail(m));
        }
        let (n, header) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|e| fail(explain(&e, bytes)))?;
        // The crate checked that the tensors tile the data section exactly.
        let data = &bytes[8 + n..];
        let mut out = SafeTensors::new();
        if let Some(m) = header.metadata() {
            out.metadata = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        for (name, info) in header.tensors() {
            let dtype =
                from_crate(info.dtype).ok_or_else(|| fail(unknown_dtype(&name, &info.dtype)))?;
            let shape = i64_shape(&info.shape)
                .ok_or_else(|| fail(format!("tensor `{name}` has a dimension beyond i64")))?;
            let (begin, end) = info.data_offsets;
            let t = StoredTensor {
                dtype,
                shape,
                data: data[begin..end].to_vec(),
            };
            out.tensors.insert(name, t);
        }
        if out.metadata.remove(CHECKSUM_KEY).is_some() {
            let seal = header_seal(bytes)
                .and_then(|s| {
                    s.ok_or_else(|| files::missing_seal(&bytes[..header_end(bytes)], SEAL_PREFIX))
                })
                .map_err(fail)?;
            check_sealed(bytes, seal).map_err(fail)?;
        } else if let Some(recorded) = out.metadata.remove(LEGACY_CHECKSUM_KEY) {
            let recorded = parse_checksum(&recorded).map_err(fail)?;
            check_checksum(crc64(data), recorded).map_err(fail)?;
        }
        Ok(out)
    }

    /// Removes tensor `name` and returns its bytes, checking its dtype and
    /// shape; errors name the file, the tensor, and what was expected and
    /// found. On an error the tensor stays in place.
    pub fn take(
        &mut self,
        path_for_errors: &Path,
        name: &str,
        dtype: DType,
        shape: &[i64],
    ) -> Result<Vec<u8>> {
        let fail = |message: String| TrainError::Checkpoint {
            path: PathBuf::from(path_for_errors),
            message,
        };
        let Some(t) = self.tensors.get(name) else {
            return Err(fail(format!(
                "has no tensor `{name}` (expected {dtype} {})",
                show_shape(shape)
            )));
        };
        if t.dtype != dtype || t.shape != shape {
            return Err(fail(format!(
                "tensor `{name}` is {} {}, expected {dtype} {}",
                t.dtype,
                show_shape(&t.shape),
                show_shape(shape)
            )));
        }
        Ok(self
            .tensors
            .remove(name)
            .map(|t| t.data)
            .unwrap_or_default())
    }
}

/// The seal in the header of the safetensors file `bytes` (the length
/// field and the header; never the data), if it has one.
fn header_seal(bytes: &[u8]) -> std::result::Result<Option<files::Seal>, String> {
    files::find_seal(&bytes[..header_end(bytes)], SEAL_PREFIX)
}

/// Where the header of the safetensors file `bytes` ends (0 when its
/// length field is missing or impossible).
fn header_end(bytes: &[u8]) -> usize {
    bytes
        .first_chunk::<8>()
        .map(|n| u64::from_le_bytes(*n))
        .filter(|&n| n <= MAX_HEADER_BYTES && n <= bytes.len() as u64 - 8)
        .map_or(0, |n| 8 + n as usize)
}

/// Checks the whole-file checksum of `bytes` against `seal`.
fn check_sealed(bytes: &[u8], seal: files::Seal) -> std::result::Result<(), String> {
    files::seal_matches(!files::crc_skipping(!0, bytes, 0, seal.at), seal.recorded)
}

/// The first key that a JSON object of `header` has twice (a tensor name,
/// a metadata key, a field of an entry), or that is longer than
/// [`MAX_NAME`], as a message; `None` when there is
/// none or `header` is not JSON (the parser reports that).
pub fn duplicate_key(header: &[u8]) -> Option<String> {
    use serde::de::{Deserialize, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
    struct NoDup;
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = NoDup;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> std::result::Result<NoDup, E> {
            Ok(NoDup)
        }
        fn visit_i64<E>(self, _: i64) -> std::result::Result<NoDup, E> {
            Ok(NoDup)
        }
        fn visit_u64<E>(self, _: u64) -> std::result::Result<NoDup, E> {
            Ok(NoDup)
        }
        fn visit_f64<E>(self, _: f64) -> std::result::Result<NoDup, E> {
            Ok(NoDup)
        }
        fn visit_str<E>(self, _: &str) -> std::result::Result<NoDup, E> {
            Ok(NoDup)
        }
        fn visit_unit<E>(self) -> std::result::Result<NoDup, E> {
            Ok(NoDup)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<NoDup, A::Error> {
            while seq.next_element::<NoDup>()?.is_some() {}
            Ok(NoDup)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<NoDup, A::Error> {
            let mut seen = std::collections::BTreeSet::new();
            while let Some(k) = map.next_key::<String>()? {
                if k.chars().count() > MAX_NAME {
                    let _ = map.next_value::<IgnoredAny>();
                    return Err(A::Error::custom(format!("LONG{k}")));
                }
                if seen.contains(&k) {
                    let _ = map.next_value::<IgnoredAny>();
                    return Err(A::Error::custom(format!("DUP{k}")));
                }
                map.next_value::<NoDup>()?;
                seen.insert(k);
            }
            Ok(NoDup)
        }
    }
    impl<'de> Deserialize<'de> for NoDup {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<NoDup, D::Error> {
            d.deserialize_any(V)
        }
    }
    let e = serde_json::from_slice::<NoDup>(header).err()?;
    let text = e.to_string();
    if let Some(key) = text.strip_prefix("LONG") {
        let key = key.rsplit_once(" at line ").map_or(key, |(k, _)| k);
        return Some(format!(
            "has a name of {} characters in its header, {}, more than the {MAX_NAME} a tensor \
             name or field may have",
            key.chars().count(),
            polychip_comm::text::quoted(key)
        ));
    }
    let key = text.strip_prefix("DUP")?;
    let key = key.rsplit_once(" at line ").map_or(key, |(k, _)| k);
    Some(format!(
        "has `{key}` twice in one object of its header (a duplicated tensor name or \
         field); which one is meant is ambiguous, so the file is refused"
    ))
}

fn check_tensor(name: &str, t: &StoredTensor) -> Result<()> {
    let expected = byte_len(t.dtype, &t.shape).ok_or_else(|| {
        TrainError::Config(format!(
            "tensor `{name}` has shape {}, which has a negative dimension \
             or too many elements",
            show_shape(&t.shape)
        ))
    })?;
    if expected != t.data.len() as u64 {
        return Err(TrainError::Config(format!(
            "tensor `{name}` of {} {} needs {expected} bytes but was given {}",
            t.dtype,
            show_shape(&t.shape),
            t.data.len()
        )));
    }
    Ok(())
}

fn i64_shape(shape: &[usize]) -> Option<Vec<i64>> {
    shape.iter().map(|&d| i64::try_from(d).ok()).collect()
}

fn parse_checksum(recorded: &str) -> std::result::Result<u64, String> {
    u64::from_str_radix(recorded, 16)
        .map_err(|_| format!("has metadata {CHECKSUM_KEY} = {recorded:?}, not a hex checksum"))
}

fn check_checksum(actual: u64, recorded: u64) -> std::result::Result<(), String> {
    if actual != recorded {
        return Err(format!(
            "is corrupt: checksum {actual:016x} of its data differs \
             from the {recorded:016x} recorded in its header"
        ));
    }
    Ok(())
}

/// One tensor of a [`Header`]: where its bytes are, not the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    /// Its dtype as the file names it (`F32`, `BF16`, `F8_E4M3`, ...).
    pub dtype_name: String,
    /// Its dtype, when polychip reads it.
    pub dtype: Option<DType>,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its first byte, relative to the data section.
    pub begin: u64,
    /// One past its last byte, relative to the data section.
    pub end: u64,
}

/// The header of a safetensors file, read without its data: for importing
/// large files tensor by tensor, and for checking names and shapes before
/// reading (or allocating for) anything.
#[derive(Debug, Clone)]
pub struct Header {
    /// The file.
    pub path: PathBuf,
    /// Its metadata (with [`CHECKSUM_KEY`], if it has one).
    pub metadata: BTreeMap<String, String>,
    /// Its tensors by name.
    pub tensors: BTreeMap<String, HeaderEntry>,
    /// The file offset of the data section.
    pub data_start: u64,
    /// The data section's length.
    pub data_len: u64,
    /// The length field and header bytes, and the seal in them (for
    /// [`Header::verify_checksum`]).
    raw: Vec<u8>,
    seal: Option<files::Seal>,
}

impl Header {
    /// Reads and validates the header of `path` (with the crate's header
    /// type): at most [`MAX_HEADER_BYTES`] are read, and the tensors' byte
    /// ranges must tile the rest of the file exactly.
    pub fn read(path: &Path) -> Result<Header> {
        let fail = |message: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        let io = |e| TrainError::io(path, e);
        let (mut file, file_len) = files::open_regular(path, Links::Follow, u64::MAX)?;
        let mut len_bytes = [0u8; 8];
        if file_len < 8 {
            return Err(fail(too_short(file_len)));
        }
        file.read_exact(&mut len_bytes).map_err(io)?;
        let n = u64::from_le_bytes(len_bytes);
        if let Some(m) = framing(n, file_len - 8) {
            return Err(fail(m));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(io)?;
        let data_len = file_len - 8 - n;
        if let Some(m) = duplicate_key(&header) {
            return Err(fail(m));
        }
        let parsed: Metadata = serde_json::from_slice(&header).map_err(|e| {
            fail(diagnose(&header, data_len).unwrap_or_else(|| {
                format!("has a header the safetensors format does not allow: {e}")
            }))
        })?;
        if parsed.data_len() as u64 != data_len {
            return Err(fail(diagnose(&header, data_len).unwrap_or_else(|| {
                format!(
                    "has a {data_len}-byte data section but its tensors cover {} bytes",
                    parsed.data_len()
                )
            })));
        }
        let mut tensors = BTreeMap::new();
        for (name, info) in parsed.tensors() {
            let shape = i64_shape(&info.shape)
                .ok_or_else(|| fail(format!("tensor `{name}` has a dimension beyond i64")))?;
            let entry = HeaderEntry {
                dtype_name: info.dtype.to_string(),
                dtype: from_crate(info.dtype),
                shape,
                begin: info.data_offsets.0 as u64,
                end: info.data_offsets.1 as u64,
            };
            tensors.insert(name, entry);
        }
        let metadata: BTreeMap<String, String> = parsed
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let mut raw = len_bytes.to_vec();
        raw.extend_from_slice(&header);
        let seal = files::find_seal(&raw, SEAL_PREFIX).map_err(fail)?;
        if seal.is_none() && metadata.contains_key(CHECKSUM_KEY) {
            return Err(fail(files::missing_seal(&raw, SEAL_PREFIX)));
        }
        Ok(Header {
            path: path.to_path_buf(),
            metadata,
            tensors,
            data_start: 8 + n,
            data_len,
            raw,
            seal,
        })
    }

    /// The whole-file checksum the file records under [`CHECKSUM_KEY`]
    /// (not checked: see [`Header::verify_checksum`]).
    pub fn checksum(&self) -> Option<u64> {
        self.seal.map(|s| s.recorded)
    }

    /// Reads the bytes of tensor `name` (one seek and read: nothing else of
    /// the file is read).
    pub fn read_tensor(&self, file: &mut File, name: &str) -> Result<Vec<u8>> {
        let Some(e) = self.tensors.get(name) else {
            return Err(TrainError::Checkpoint {
                path: self.path.clone(),
                message: format!("has no tensor `{name}`"),
            });
        };
        let mut out = vec![0u8; (e.end - e.begin) as usize];
        file.seek(SeekFrom::Start(self.data_start + e.begin))
            .and_then(|_| file.read_exact(&mut out))
            .map_err(|err| TrainError::io(&self.path, err))?;
        Ok(out)
    }

    /// When the file records a [`CHECKSUM_KEY`], reads it in pieces and
    /// refuses it if the checksum of the whole file differs; else, when it
    /// records a [`LEGACY_CHECKSUM_KEY`], the same of its data section; a
    /// file with neither (another writer's) is not checked.
    pub fn verify_checksum(&self, file: &mut File) -> Result<()> {
        let fail = |message: String| TrainError::Checkpoint {
            path: self.path.clone(),
            message,
        };
        let (mut crc, recorded) = match (self.seal, self.metadata.get(LEGACY_CHECKSUM_KEY)) {
            (Some(seal), _) => (
                files::crc_skipping(!0, &self.raw, 0, seal.at),
                seal.recorded,
            ),
            (None, Some(legacy)) => (!0u64, parse_checksum(legacy).map_err(fail)?),
            (None, None) => return Ok(()),
        };
        file.seek(SeekFrom::Start(self.data_start))
            .map_err(|e| TrainError::io(&self.path, e))?;
        let mut left = self.data_len;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            let k = left.min(buf.len() as u64) as usize;
            file.read_exact(&mut buf[..k])
                .map_err(|e| TrainError::io(&self.path, e))?;
            crc = crc64_update(crc, &buf[..k]);
            left -= k as u64;
        }
        match self.seal {
            Some(_) => files::seal_matches(!crc, recorded).map_err(fail),
            None => check_checksum(!crc, recorded).map_err(fail),
        }
    }
}

fn too_short(len: u64) -> String {
    format!("is {len} bytes long, too short to hold the 8-byte header length")
}

/// What is wrong with a header length of `n` when `after` bytes follow the
/// length field, if anything.
fn framing(n: u64, after: u64) -> Option<String> {
    if n > MAX_HEADER_BYTES {
        return Some(format!(
            "claims a {n}-byte header, more than the {MAX_HEADER_BYTES} bytes any real \
             checkpoint needs"
        ));
    }
    if n > after {
        return Some(format!(
            "claims a {n}-byte header but only {after} bytes follow the header length \
             (truncated?)"
        ));
    }
    None
}

/// Our words for the crate's refusal of `bytes`: the framing fault, or what
/// [`diagnose`] finds in the header, or else the crate's own message.
fn explain(err: &SafeTensorError, bytes: &[u8]) -> String {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return too_short(bytes.len() as u64);
    };
    let n = u64::from_le_bytes(*len);
    if let Some(m) = framing(n, rest.len() as u64) {
        return m;
    }
    let (header, data) = rest.split_at(n as usize);
    diagnose(header, data.len() as u64)
        .unwrap_or_else(|| format!("is not a safetensors file the format allows: {err}"))
}

/// Looks at a header the crate refused and names the tensor and the fault:
/// not UTF-8 or JSON, not an object, a bad `__metadata__`, a bad entry
/// (dtype, shape, offsets, a size that does not match its dtype and shape),
/// tensors that overlap or leave gaps, data past the end or after the last
/// tensor. `None` when it finds nothing (the caller then reports the
/// crate's message).
fn diagnose(header: &[u8], data_len: u64) -> Option<String> {
    let header = match std::str::from_utf8(header) {
        Ok(h) => h,
        Err(e) => return Some(format!("has a header that is not UTF-8: {e}")),
    };
    let header: Value = match serde_json::from_str(header) {
        Ok(v) => v,
        Err(e) => return Some(format!("has a header that is not valid JSON: {e}")),
    };
    let Value::Object(header) = header else {
        return Some("has a header that is not a JSON object".into());
    };
    let mut spans = Vec::new();
    for (name, entry) in &header {
        if name == "__metadata__" {
            if let Err(m) = check_metadata(entry) {
                return Some(m);
            }
            continue;
        }
        match check_entry(name, entry, data_len) {
            Ok((begin, end)) => spans.push((begin, end, name.clone())),
            Err(m) => return Some(m),
        }
    }
    spans.sort();
    let mut at = 0;
    let mut previous: Option<&str> = None;
    for (begin, end, name) in &spans {
        if *begin != at {
            let after = match previous {
                Some(p) => format!("tensor `{p}`, which ends at byte {at}"),
                None => "the start of the data section".into(),
            };
            let what = if *begin < at {
                "overlaps"
            } else {
                "leaves a gap after"
            };
            return Some(format!(
                "tensor `{name}` (bytes {begin}..{end} of the data) {what} {after}"
            ));
        }
        at = *end;
        previous = Some(name);
    }
    if at != data_len {
        return Some(format!(
            "has {} bytes after its last tensor, which ends at byte {at} \
             of the {data_len}-byte data section",
            data_len - at,
        ));
    }
    None
}

/// The `__metadata__` object must map strings to strings.
fn check_metadata(value: &Value) -> std::result::Result<(), String> {
    let Value::Object(map) = value else {
        return Err("has __metadata__ that is not a JSON object".into());
    };
    for (k, v) in map {
        if !v.is_string() {
            return Err(format!("has __metadata__ entry `{k}` = {v}, not a string"));
        }
    }
    Ok(())
}

/// One tensor entry of the header: its byte span, or what is wrong with it.
fn check_entry(
    name: &str,
    entry: &Value,
    data_len: u64,
) -> std::result::Result<(u64, u64), String> {
    if !entry.is_object() {
        return Err(format!(
            "tensor `{name}` has a header entry that is not an object"
        ));
    }
    let field = |key: &str| {
        entry
            .get(key)
            .ok_or_else(|| format!("tensor `{name}` has no `{key}` in the header"))
    };
    let tag_value = field("dtype")?;
    let tag = tag_value
        .as_str()
        .map_or_else(|| tag_value.to_string(), str::to_string);
    let parsed: Option<Dtype> = serde_json::from_value(tag_value.clone()).ok();
    let size = match parsed {
        Some(d) if d.bitsize() % 8 == 0 => (d.bitsize() / 8) as u64,
        // Sub-byte dtypes: polychip reads none of them.
        _ => return Err(unknown_dtype(name, &tag)),
    };
    let shape_value = field("shape")?;
    let shape: Vec<i64> = shape_value
        .as_array()
        .and_then(|dims| dims.iter().map(Value::as_i64).collect::<Option<_>>())
        .ok_or_else(|| {
            format!("tensor `{name}` has shape {shape_value}, not a list of integers")
        })?;
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(format!(
            "tensor `{name}` has shape {}, with negative dimension {d}",
            show_shape(&shape)
        ));
    }
    let offsets_value = field("data_offsets")?;
    let offsets: Vec<u64> = offsets_value
        .as_array()
        .and_then(|o| o.iter().map(Value::as_u64).collect::<Option<_>>())
        .filter(|o: &Vec<u64>| o.len() == 2)
        .ok_or_else(|| {
            format!(
                "tensor `{name}` has data_offsets {offsets_value}, not a pair of \
                 non-negative integers"
            )
        })?;
    let (begin, end) = (offsets[0], offsets[1]);
    if end < begin {
        return Err(format!(
            "tensor `{name}` has data_offsets [{begin}, {end}], which end before they begin"
        ));
    }
    let expected = numel(&shape).and_then(|n| n.checked_mul(size));
    if expected != Some(end - begin) {
        return Err(format!(
            "tensor `{name}` of {tag} {} needs {} bytes but its \
             data_offsets [{begin}, {end}] span {}",
            show_shape(&shape),
            expected.map_or("too many".to_string(), |n| n.to_string()),
            end - begin
        ));
    }
    if end > data_len {
        return Err(format!(
            "tensor `{name}` has data_offsets [{begin}, {end}] beyond the \
             {data_len}-byte data section (truncated?)"
        ));
    }
    Ok((begin, end))
}
