//! Checkpoints in the safetensors format, written and read by our own code.
//!
//! A file is: an 8-byte little-endian `u64` N; N bytes of UTF-8 JSON, padded
//! with spaces to a multiple of 8, mapping each tensor name to
//! `{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}` (offsets
//! relative to the first byte after the header), plus an optional
//! `"__metadata__"` object of strings; then the data: every tensor
//! little-endian and row-major, packed with no gaps. We write tensors sorted
//! by name, so equal contents give equal files, and record a CRC-64 of the
//! data section under [`CHECKSUM_KEY`] in the metadata; a file carrying that
//! key is refused when its data does not match, one without it (from another
//! writer) is accepted.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use polychip_host::DType;
use serde_json::{Map, Value};

use crate::error::{Result, TrainError};

/// Metadata key holding the CRC-64/XZ of the data section, 16 hex digits.
pub const CHECKSUM_KEY: &str = "polychip.crc64";

/// The largest header we accept: anything larger is a corrupt length.
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

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

/// The dtype of a safetensors name, if polychip supports it.
fn dtype_from_tag(tag: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_tag(d) == tag)
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
fn show_shape(shape: &[i64]) -> String {
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
    let mut crc = !0u64;
    for &b in bytes {
        crc = CRC64_TABLE[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
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
        self.tensors.insert(name, t);
        Ok(())
    }

    /// Serializes to safetensors bytes: tensors sorted by name, metadata
    /// plus [`CHECKSUM_KEY`], header padded with spaces to a multiple of 8.
    pub fn to_bytes(&self) -> Vec<u8> {
        let data_len: usize = self.tensors.values().map(|t| t.data.len()).sum();
        let mut data = Vec::with_capacity(data_len);
        let mut header = Map::new();
        let mut entries = Vec::with_capacity(self.tensors.len());
        for (name, t) in &self.tensors {
            let begin = data.len();
            data.extend_from_slice(&t.data);
            let mut entry = Map::new();
            entry.insert("dtype".into(), dtype_tag(t.dtype).into());
            entry.insert("shape".into(), t.shape.clone().into());
            entry.insert("data_offsets".into(), vec![begin, data.len()].into());
            entries.push((name.clone(), Value::Object(entry)));
        }
        let mut metadata: Map<String, Value> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        metadata.insert(CHECKSUM_KEY.into(), format!("{:016x}", crc64(&data)).into());
        header.insert("__metadata__".into(), Value::Object(metadata));
        header.extend(entries);
        let mut json = Value::Object(header).to_string().into_bytes();
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let mut out = Vec::with_capacity(8 + json.len() + data.len());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(&data);
        out
    }

    /// Writes the file atomically: to `<path>.tmp-<pid>`, synced, renamed
    /// over `path`, then the directory synced. A failed save leaves any
    /// earlier file at `path` intact and removes its temporary file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let written = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(&self.to_bytes())?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(TrainError::io(&tmp, e));
        }
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(TrainError::io(path, e));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| TrainError::io(dir, e))
    }

    /// Reads a file written by [`SafeTensors::save`] or any safetensors
    /// writer.
    pub fn load(path: &Path) -> Result<SafeTensors> {
        let bytes = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
        SafeTensors::from_bytes(path, &bytes)
    }

    /// Parses safetensors bytes, refusing every corruption with
    /// [`TrainError::Checkpoint`] naming `path_for_errors`.
    pub fn from_bytes(path_for_errors: &Path, bytes: &[u8]) -> Result<SafeTensors> {
        let fail = |message: String| TrainError::Checkpoint {
            path: PathBuf::from(path_for_errors),
            message,
        };
        let Some((len_bytes, rest)) = bytes.split_first_chunk::<8>() else {
            return Err(fail(format!(
                "is {} bytes long, too short to hold the 8-byte header length",
                bytes.len()
            )));
        };
        let header_len = u64::from_le_bytes(*len_bytes);
        if header_len > MAX_HEADER_BYTES {
            return Err(fail(format!(
                "claims a {header_len}-byte header, more than the \
                 {MAX_HEADER_BYTES} bytes any real checkpoint needs"
            )));
        }
        if header_len > rest.len() as u64 {
            return Err(fail(format!(
                "claims a {header_len}-byte header but only {} bytes follow \
                 the header length (truncated?)",
                rest.len()
            )));
        }
        let (header, data) = rest.split_at(header_len as usize);
        let header = std::str::from_utf8(header)
            .map_err(|e| fail(format!("has a header that is not UTF-8: {e}")))?;
        let header: Value = serde_json::from_str(header)
            .map_err(|e| fail(format!("has a header that is not valid JSON: {e}")))?;
        let Value::Object(header) = header else {
            return Err(fail("has a header that is not a JSON object".into()));
        };

        let mut out = SafeTensors::new();
        let mut spans = Vec::new();
        for (name, entry) in header {
            if name == "__metadata__" {
                out.metadata = parse_metadata(&entry).map_err(fail)?;
                continue;
            }
            let (t, begin, end) = parse_entry(&name, &entry, data).map_err(fail)?;
            spans.push((begin, end, name.clone()));
            out.tensors.insert(name, t);
        }

        spans.sort();
        let mut at = 0;
        for (begin, end, name) in &spans {
            if *begin != at {
                let what = if *begin < at {
                    "overlaps"
                } else {
                    "leaves a gap before"
                };
                return Err(fail(format!(
                    "tensor `{name}` (bytes {begin}..{end} of the data) {what} \
                     the previous tensor, which ends at byte {at}"
                )));
            }
            at = *end;
        }
        if at != data.len() {
            return Err(fail(format!(
                "has {} bytes after its last tensor, which ends at byte {at} \
                 of the {}-byte data section",
                data.len() - at,
                data.len()
            )));
        }

        if let Some(recorded) = out.metadata.remove(CHECKSUM_KEY) {
            let recorded = u64::from_str_radix(&recorded, 16).map_err(|_| {
                fail(format!(
                    "has metadata {CHECKSUM_KEY} = {recorded:?}, not a hex checksum"
                ))
            })?;
            let actual = crc64(data);
            if actual != recorded {
                return Err(fail(format!(
                    "is corrupt: checksum {actual:016x} of its data differs \
                     from the {recorded:016x} recorded in its header"
                )));
            }
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

/// The `__metadata__` object as strings.
fn parse_metadata(value: &Value) -> std::result::Result<BTreeMap<String, String>, String> {
    let Value::Object(map) = value else {
        return Err("has __metadata__ that is not a JSON object".into());
    };
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(format!(
                "has __metadata__ entry `{k}` = {other}, not a string"
            )),
        })
        .collect()
}

/// One tensor entry of the header, with its data, and its byte span.
fn parse_entry(
    name: &str,
    entry: &Value,
    data: &[u8],
) -> std::result::Result<(StoredTensor, usize, usize), String> {
    let field = |key: &str| {
        entry
            .get(key)
            .ok_or_else(|| format!("tensor `{name}` has no `{key}` in the header"))
    };
    if !entry.is_object() {
        return Err(format!(
            "tensor `{name}` has a header entry that is not an object"
        ));
    }
    let tag = field("dtype")?;
    let dtype = tag.as_str().and_then(dtype_from_tag).ok_or_else(|| {
        let known: Vec<&str> = DType::ALL.into_iter().map(dtype_tag).collect();
        format!(
            "tensor `{name}` has dtype {tag}, which polychip does not read \
             (known: {})",
            known.join(", ")
        )
    })?;
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
    if end > data.len() as u64 {
        return Err(format!(
            "tensor `{name}` has data_offsets [{begin}, {end}] beyond the \
             {}-byte data section (truncated?)",
            data.len()
        ));
    }
    let expected = byte_len(dtype, &shape);
    if expected != Some(end - begin) {
        return Err(format!(
            "tensor `{name}` of {dtype} {} needs {} bytes but its \
             data_offsets [{begin}, {end}] span {}",
            show_shape(&shape),
            expected.map_or("too many".to_string(), |n| n.to_string()),
            end - begin
        ));
    }
    let (begin, end) = (begin as usize, end as usize);
    let t = StoredTensor {
        dtype,
        shape,
        data: data[begin..end].to_vec(),
    };
    Ok((t, begin, end))
}
