//! The SDK's reading of an operator call from arbitrary bytes: an args
//! struct of any operator with tensors of any rank, extents, strides,
//! dtype, device and offset, and any scalars, checked exactly as a plugin
//! built on the SDK checks a host's call. It must return a checked struct
//! or an error, never panic or overflow. Which struct each operator takes
//! comes from `generated.rs`, which `cargo run -p polychip-spec` derives
//! from `spec/ops.toml` with the SDK's files.

use polychip_plugin_sdk::abi::{self, PolychipDataType, PolychipDevice, PolychipTensor};
use polychip_plugin_sdk::{FieldKind, Op, RawArgs};

#[rustfmt::skip]
mod generated;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn i64(&mut self) -> i64 {
        // Mostly small extents, sometimes anything.
        let b = self.u8();
        if b & 0x80 == 0 {
            i64::from(b & 0x1f) - 2
        } else {
            i64::from_le_bytes(self.take())
        }
    }
}

/// Storage for one tensor's shape and strides.
struct Dims {
    shape: Vec<i64>,
    strides: Vec<i64>,
}

fn tensor(b: &mut Bytes<'_>, dims: &mut Vec<Dims>) -> PolychipTensor {
    let ndim = i32::from(b.u8() % 10) - 1; // -1..=8
    let n = ndim.max(0) as usize;
    let shape: Vec<i64> = (0..n).map(|_| b.i64()).collect();
    let strided = b.u8() & 1 == 1;
    let strides: Vec<i64> = (0..n).map(|_| b.i64()).collect();
    dims.push(Dims { shape, strides });
    let d = dims.last().unwrap();
    let flags = b.u8();
    PolychipTensor {
        data: (0x1000usize + usize::from(b.u8()) * 8) as *mut _,
        device: PolychipDevice {
            device_type: if flags & 1 == 0 {
                abi::POLYCHIP_DEVICE_TYPE_EXT
            } else {
                i32::from(b.u8())
            },
            device_id: i32::from(flags >> 6),
        },
        ndim,
        dtype: PolychipDataType {
            code: b.u8() % 6,
            bits: [8, 16, 32, 64, 1, 7][usize::from(b.u8() % 6)],
            lanes: if flags & 2 == 0 { 1 } else { u16::from(b.u8()) },
        },
        shape: if n == 0 && flags & 4 != 0 {
            std::ptr::null()
        } else {
            d.shape.as_ptr()
        },
        strides: if strided {
            d.strides.as_ptr()
        } else {
            std::ptr::null()
        },
        byte_offset: if flags & 8 == 0 {
            u64::from(b.u8())
        } else {
            u64::from_le_bytes(b.take())
        },
    }
}

/// Fills an args struct of type `T` for `op` from the bytes and checks it;
/// returns `T`'s name, which must be the one the SDK's table gives `op`.
fn check<T: RawArgs + Copy>(op: Op, b: &mut Bytes<'_>) -> &'static str {
    let info = op.info();
    let name = std::any::type_name::<T>()
        .rsplit("::")
        .next()
        .unwrap_or_default();
    assert_eq!(
        name, info.args,
        "{op}: fuzz/src/op_args/generated.rs is stale: run `cargo run -p polychip-spec`"
    );
    assert_eq!(std::mem::size_of::<T>(), info.size);
    let mut raw = vec![0u8; info.size];
    raw[..8].copy_from_slice(&(info.size as u64).to_ne_bytes());
    let mut dims = Vec::with_capacity(16);
    for field in info.fields {
        let at = field.offset;
        match field.kind {
            FieldKind::In | FieldKind::Out | FieldKind::InOut => {
                let t = tensor(b, &mut dims);
                // SAFETY: the field's offset and type come from the spec
                // that generated `T`; the buffer is `info.size` bytes.
                unsafe {
                    raw.as_mut_ptr()
                        .add(at)
                        .cast::<PolychipTensor>()
                        .write_unaligned(t)
                };
            }
            FieldKind::F64 => raw[at..at + 8].copy_from_slice(&b.take::<8>()),
            FieldKind::I64 => raw[at..at + 8].copy_from_slice(&b.take::<8>()),
            FieldKind::I32 => raw[at..at + 4].copy_from_slice(&b.take::<4>()),
            FieldKind::Flag => raw[at] = b.u8(),
        }
    }
    // SAFETY: `raw` holds a `T` laid out field by field as the spec says
    // (plain data and pointers to `dims`, which outlives the check).
    let args: T = unsafe { raw.as_ptr().cast::<T>().read_unaligned() };
    // SAFETY: every non-NULL shape and strides pointer points to `ndim`
    // i64s in `dims` (a negative ndim is refused before they are read).
    let _ = unsafe { args.check(op, 0) };
    name
}

/// One input.
pub fn run(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let op = Op::ALL[usize::from(which) % Op::ALL.len()];
    let mut b = Bytes(rest);
    generated::dispatch(op, &mut b);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{Bytes, generated};
    use polychip_plugin_sdk::Op;

    /// The args structs named in `spec/ops.toml` (`[args.Name]`), read
    /// directly from the spec rather than from anything derived from it.
    fn spec_args() -> BTreeSet<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../spec/ops.toml");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let spec: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        let args = spec["args"]
            .as_table()
            .expect("spec/ops.toml has [args.*] tables");
        args.keys().map(|k| format!("Polychip{k}Args")).collect()
    }

    #[test]
    fn every_args_struct_of_the_spec_is_checked() {
        let mut checked = BTreeSet::new();
        for op in Op::ALL {
            // `check` asserts that the struct is the one the SDK's table
            // gives the operator; empty input reads as zeros.
            checked.insert(generated::dispatch(op, &mut Bytes(&[])).to_owned());
        }
        let spec = spec_args();
        let missing: Vec<_> = spec.difference(&checked).collect();
        assert!(
            missing.is_empty(),
            "args structs of spec/ops.toml that no operator's fuzz dispatch \
             checks: {missing:?} (run `cargo run -p polychip-spec`)"
        );
        assert_eq!(checked, spec);
    }
}
