//! The checkpoint and Hugging Face tensor-file reader from arbitrary bytes:
//! a sealed polychip stage file (whole-file checksum) and a plain
//! safetensors file (header, offsets, dtypes, shapes). Each must parse or
//! be refused with an error, never panic, overflow or allocate beyond the
//! input's size.

use std::path::Path;

use polychip_train::safetensors::{SafeTensors, duplicate_key};

/// One input.
pub fn run(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    let _ = SafeTensors::from_sealed_bytes(path, data);
    if let Ok(t) = SafeTensors::from_bytes(path, data) {
        // What parsed must write back and parse again.
        let again = t.to_bytes();
        assert!(SafeTensors::from_bytes(path, &again).is_ok());
    }
    if data.len() >= 8 {
        let _ = duplicate_key(&data[8..]);
    }
}
