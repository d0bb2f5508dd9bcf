//! Safetensors checkpoints: round trips, atomic saves, and refusal of every
//! kind of corrupt file.

use std::path::{Path, PathBuf};

use polychip_host::DType;
use polychip_train::TrainError;
use polychip_train::safetensors::{CHECKSUM_KEY, SafeTensors, StoredTensor, crc64};

fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("checkpoint-tests")
        .join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn sample() -> SafeTensors {
    let mut st = SafeTensors::new();
    let w: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    st.insert(
        "layers.0.w",
        StoredTensor {
            dtype: DType::F32,
            shape: vec![2, 3],
            data: f32_bytes(&w),
        },
    )
    .unwrap();
    let h: Vec<u8> = [1.5f32, -2.0, 0.25]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    st.insert(
        "half",
        StoredTensor {
            dtype: DType::F16,
            shape: vec![3],
            data: h,
        },
    )
    .unwrap();
    let b: Vec<u8> = [3.0f32; 4]
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    st.insert(
        "bf",
        StoredTensor {
            dtype: DType::BF16,
            shape: vec![2, 1, 2],
            data: b,
        },
    )
    .unwrap();
    st.insert(
        "step",
        StoredTensor {
            dtype: DType::I64,
            shape: vec![],
            data: 1234i64.to_le_bytes().to_vec(),
        },
    )
    .unwrap();
    st.insert(
        "ids",
        StoredTensor {
            dtype: DType::I32,
            shape: vec![2],
            data: [7i32, -7].iter().flat_map(|v| v.to_le_bytes()).collect(),
        },
    )
    .unwrap();
    st.insert(
        "empty",
        StoredTensor {
            dtype: DType::F32,
            shape: vec![0, 4],
            data: vec![],
        },
    )
    .unwrap();
    st.metadata.insert("format".into(), "polychip".into());
    st.metadata
        .insert("note".into(), "ünïcode \"quoted\"".into());
    st
}

fn refused(bytes: &[u8]) -> String {
    let path = Path::new("/ckpt/model.safetensors");
    match SafeTensors::from_bytes(path, bytes) {
        Err(e @ TrainError::Checkpoint { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("/ckpt/model.safetensors"), "{msg}");
            msg
        }
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

/// A file from a header written by hand and its data.
fn file_of(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn crc64_matches_its_check_value() {
    assert_eq!(crc64(b"123456789"), 0x995d_c9bb_df19_39fa);
    assert_eq!(crc64(b""), 0);
}

#[test]
fn round_trip_in_memory_and_on_disk() {
    let st = sample();
    let bytes = st.to_bytes();
    assert_eq!(bytes, st.to_bytes(), "serialization is deterministic");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(header_len % 8, 0);
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    assert!(header.contains(CHECKSUM_KEY), "{header}");
    assert!(header.contains("\"BF16\""), "{header}");
    let back = SafeTensors::from_bytes(Path::new("mem"), &bytes).unwrap();
    assert_eq!(back, st, "metadata comes back without the checksum key");

    let dir = scratch_dir("round-trip");
    let path = dir.join("model.safetensors");
    st.save(&path).unwrap();
    assert_eq!(SafeTensors::load(&path).unwrap(), st);
    // Saving again replaces the file.
    let mut smaller = SafeTensors::new();
    smaller
        .insert(
            "x",
            StoredTensor {
                dtype: DType::U8,
                shape: vec![3],
                data: vec![1, 2, 3],
            },
        )
        .unwrap();
    smaller.save(&path).unwrap();
    assert_eq!(SafeTensors::load(&path).unwrap(), smaller);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["model.safetensors"], "no temporary file is left");
}

#[test]
fn an_empty_checkpoint_round_trips() {
    let st = SafeTensors::new();
    assert_eq!(
        SafeTensors::from_bytes(Path::new("mem"), &st.to_bytes()).unwrap(),
        st
    );
}

#[test]
fn a_failed_save_keeps_the_old_file() {
    let dir = scratch_dir("failed-save");
    let path = dir.join("model.safetensors");
    sample().save(&path).unwrap();
    // A directory where the temporary file must go makes the write fail.
    let tmp = dir.join(format!(".model.safetensors.tmp-{}", std::process::id()));
    std::fs::create_dir(&tmp).unwrap();
    let err = SafeTensors::new().save(&path).unwrap_err();
    assert!(matches!(err, TrainError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("model.safetensors.tmp-"), "{err}");
    assert_eq!(SafeTensors::load(&path).unwrap(), sample());
    // A directory that does not exist.
    let err = sample()
        .save(&dir.join("missing/model.safetensors"))
        .unwrap_err();
    assert!(matches!(err, TrainError::Io { .. }), "{err:?}");
}

#[test]
fn loading_a_missing_file_names_it() {
    let path = scratch_dir("missing").join("nope.safetensors");
    let msg = SafeTensors::load(&path).unwrap_err().to_string();
    assert!(msg.contains("nope.safetensors"), "{msg}");
}

#[test]
fn insert_refuses_a_wrong_byte_length() {
    let mut st = SafeTensors::new();
    let bad = StoredTensor {
        dtype: DType::F32,
        shape: vec![2, 2],
        data: vec![0; 15],
    };
    let msg = st.insert("w", bad).unwrap_err().to_string();
    assert!(
        msg.contains("`w`") && msg.contains("16") && msg.contains("15"),
        "{msg}"
    );
    let neg = StoredTensor {
        dtype: DType::F32,
        shape: vec![-1],
        data: vec![],
    };
    assert!(st.insert("n", neg).is_err());
    assert!(st.tensors.is_empty());
}

#[test]
fn truncated_files_are_refused() {
    let bytes = sample().to_bytes();
    assert!(refused(&bytes[..5]).contains("too short"));
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert!(refused(&bytes[..8 + header_len / 2]).contains("truncated"));
    let msg = refused(&bytes[..bytes.len() - 1]);
    assert!(msg.contains("beyond") || msg.contains("truncated"), "{msg}");
    // Cut exactly after the header: every non-empty tensor is out of range.
    assert!(refused(&bytes[..8 + header_len]).contains("beyond"));
}

#[test]
fn an_absurd_header_length_is_refused() {
    let mut bytes = sample().to_bytes();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(refused(&bytes).contains("header"));
}

#[test]
fn a_flipped_data_byte_fails_the_checksum() {
    let mut bytes = sample().to_bytes();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    let msg = refused(&bytes);
    assert!(msg.contains("is corrupt: the checksum"), "{msg}");
    assert!(msg.contains("differs"), "{msg}");
}

#[test]
fn bad_headers_are_refused() {
    assert!(refused(&file_of("{\"a\": ", b"")).contains("not valid JSON"));
    assert!(refused(&file_of("[1, 2]  ", b"")).contains("not a JSON object"));
    let mut not_utf8 = file_of("{\"\u{e9}\":1}", b"");
    not_utf8[10] = 0xff;
    assert!(refused(&not_utf8).contains("UTF-8"));
    let dtype = r#"{"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}"#;
    assert!(refused(&file_of(dtype, &[0])).contains("F8_E4M3"));
    let negative = r#"{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}"#;
    assert!(refused(&file_of(negative, b"")).contains("negative"));
    let backwards = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[2,1]}}"#;
    assert!(refused(&file_of(backwards, &[0, 0])).contains("end before"));
    let size = r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#;
    assert!(refused(&file_of(size, &[0; 4])).contains("needs 8 bytes"));
    let missing = r#"{"x":{"dtype":"F32","shape":[1]}}"#;
    assert!(refused(&file_of(missing, &[0; 4])).contains("data_offsets"));
    let metadata = r#"{"__metadata__":{"a":1}}"#;
    assert!(refused(&file_of(metadata, b"")).contains("not a string"));
    let checksum = r#"{"__metadata__":{"polychip.crc64":"zz"}}"#;
    assert!(refused(&file_of(checksum, b"")).contains("not a hex checksum"));
}

#[test]
fn overlaps_gaps_and_trailing_bytes_are_refused() {
    let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                      "b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
    assert!(refused(&file_of(overlap, &[0; 3])).contains("overlaps"));
    let gap = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                  "b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}"#;
    assert!(
        refused(&file_of(gap, &[0; 3]))
            .contains("leaves a gap after tensor `a`, which ends at byte 1")
    );
    let late = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert!(
        refused(&file_of(late, &[0; 2]))
            .contains("leaves a gap after the start of the data section")
    );
    let trailing = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    assert!(refused(&file_of(trailing, &[0; 2])).contains("1 bytes after its last tensor"));
}

#[test]
fn a_file_following_the_public_format_loads() {
    // As another writer would produce it: unsorted, no checksum, names that
    // are not in data order, no padding.
    let header = concat!(
        r#"{"__metadata__":{"format":"pt"},"#,
        r#""b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},"#,
        r#""a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"#,
        r#""flag":{"dtype":"BOOL","shape":[],"data_offsets":[18,19]},"#,
        r#""h":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]}}"#
    );
    let mut data = f32_bytes(&[1.0, -2.5]);
    data.extend([5i32, -6].iter().flat_map(|v| v.to_le_bytes()));
    data.extend(half::bf16::from_f32(0.5).to_le_bytes());
    data.push(1);
    let path = Path::new("hand-made.safetensors");
    let mut st = SafeTensors::from_bytes(path, &file_of(header, &data)).unwrap();
    assert_eq!(st.metadata.get("format").map(String::as_str), Some("pt"));
    assert_eq!(
        st.take(path, "a", DType::F32, &[1, 2]).unwrap(),
        f32_bytes(&[1.0, -2.5])
    );
    assert_eq!(st.take(path, "b", DType::I32, &[2]).unwrap(), data[8..16]);
    assert_eq!(st.take(path, "h", DType::BF16, &[1]).unwrap(), data[16..18]);
    assert_eq!(st.take(path, "flag", DType::Bool, &[]).unwrap(), [1]);
    assert!(st.tensors.is_empty());
}

#[test]
fn take_names_file_tensor_expected_and_found() {
    let path = Path::new("run/step-100.safetensors");
    let mut st = sample();
    let msg = st
        .take(path, "layers.0.w", DType::F16, &[2, 3])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("run/step-100.safetensors"), "{msg}");
    assert!(
        msg.contains("`layers.0.w` is f32 [2, 3], expected f16 [2, 3]"),
        "{msg}"
    );
    let msg = st
        .take(path, "layers.0.w", DType::F32, &[3, 2])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("is f32 [2, 3], expected f32 [3, 2]"), "{msg}");
    let msg = st
        .take(path, "layers.9.w", DType::F32, &[3, 2])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no tensor `layers.9.w`"), "{msg}");
    // A failed take leaves the tensor; a good one removes it.
    assert_eq!(
        st.take(path, "layers.0.w", DType::F32, &[2, 3])
            .unwrap()
            .len(),
        24
    );
    assert!(st.take(path, "layers.0.w", DType::F32, &[2, 3]).is_err());
    assert_eq!(
        st.take(path, "step", DType::I64, &[]).unwrap(),
        1234i64.to_le_bytes()
    );
    assert!(
        st.take(path, "empty", DType::F32, &[0, 4])
            .unwrap()
            .is_empty()
    );
}

#[test]
fn headers_read_without_the_data_and_tensors_one_by_one() {
    use polychip_train::safetensors::Header;
    let dir = scratch_dir("header");
    let path = dir.join("model.safetensors");
    let st = sample();
    st.save(&path).unwrap();
    let h = Header::read(&path).unwrap();
    assert_eq!(h.tensors.len(), st.tensors.len());
    assert!(h.metadata.contains_key(CHECKSUM_KEY));
    let mut file = std::fs::File::open(&path).unwrap();
    h.verify_checksum(&mut file).unwrap();
    for (name, t) in &st.tensors {
        let e = &h.tensors[name];
        assert_eq!((e.dtype, &e.shape), (Some(t.dtype), &t.shape), "{name}");
        assert_eq!(h.read_tensor(&mut file, name).unwrap(), t.data, "{name}");
    }
    assert!(
        h.read_tensor(&mut file, "nope")
            .unwrap_err()
            .to_string()
            .contains("`nope`")
    );

    // The same refusals as a whole-file read, each naming the file.
    let bytes = st.to_bytes();
    let check = |bytes: &[u8], want: &str| {
        std::fs::write(&path, bytes).unwrap();
        let msg = Header::read(&path).unwrap_err().to_string();
        assert!(
            msg.contains("model.safetensors") && msg.contains(want),
            "{want}: {msg}"
        );
    };
    check(&bytes[..5], "too short");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    check(&bytes[..8 + header_len / 2], "truncated");
    check(&bytes[..bytes.len() - 1], "beyond");
    let mut long = bytes.clone();
    long.push(0);
    check(&long, "1 bytes after its last tensor");
    let mut absurd = bytes.clone();
    absurd[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    check(&absurd, "header");
    check(&file_of("[1, 2]  ", b""), "not a JSON object");
    // A flipped data byte passes the header but not the checksum.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x10;
    std::fs::write(&path, &flipped).unwrap();
    let h = Header::read(&path).unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let msg = h.verify_checksum(&mut file).unwrap_err().to_string();
    assert!(msg.contains("is corrupt: the checksum"), "{msg}");
}

#[test]
fn files_the_safetensors_package_writes_load() {
    // As `safetensors.torch.save_file` lays them out: aligned, the largest
    // dtypes first, metadata {"format": "pt"}.
    let header = concat!(
        r#"{"__metadata__":{"format":"pt"},"#,
        r#""w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"#,
        r#""b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}}"#
    );
    let mut padded = header.to_string();
    while padded.len() % 8 != 0 {
        padded.push(' ');
    }
    let mut data = f32_bytes(&[0.5, -1.0]);
    data.extend(
        [1.0f32, 2.0]
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()),
    );
    let st =
        SafeTensors::from_bytes(Path::new("pt.safetensors"), &file_of(&padded, &data)).unwrap();
    assert_eq!(st.tensors["w"].data, f32_bytes(&[0.5, -1.0]));
    assert_eq!(st.tensors["b"].dtype, DType::BF16);
    // Ours read back through the crate's own parser.
    let bytes = sample().to_bytes();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let parsed: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(parsed["__metadata__"]["format"], "polychip");
    let crate_view = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(crate_view.len(), sample().tensors.len());
}
