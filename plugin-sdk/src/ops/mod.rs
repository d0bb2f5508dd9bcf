//! The operators as the SDK sees them. `generated.rs` is derived from
//! `spec/ops.toml`: [`Op`] (every operator, in slot order) with its facts,
//! the enums of operators that share a method ([`UnaryOp`], ...), one
//! checked-arguments struct per ABI args struct with the only constructor
//! that makes one (it applies the spec's rules, then the hand-written rule
//! of [`crate::check::rules`] where the spec names one), and the
//! [`Operators`] trait a Rust plugin implements. This file holds what those
//! share.

#[rustfmt::skip]
mod generated;

pub use generated::*;

use std::fmt;

use crate::check::ArgError;
use crate::dtype::DType;
use crate::error::Error;

/// What `spec/ops.toml` says of one operator.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    /// The operator.
    pub op: Op,
    /// Its ABI args struct (`PolychipBinaryArgs`).
    pub args: &'static str,
    /// The args struct's size (what a caller puts in `struct_size`).
    pub size: usize,
    /// The byte offset of its entry in `PolychipOpTable`.
    pub table_offset: usize,
    /// The ABI version that introduced it.
    pub since: (u32, u32),
    /// Its family (`elementwise`, `attention`, ...).
    pub family: &'static str,
    /// The dtypes it accepts for the tensors whose dtype is the operator's.
    pub dtypes: &'static [DType],
    /// The dtypes of `dtypes` a later minor added, each with that minor's
    /// version (ABI 1.3's integer `add`, `sub` and `mul`): a host passes
    /// them only to plugins of that minor or newer.
    pub added: &'static [(DType, (u32, u32))],
    /// `dtypes` as messages write them ("f32, f16 and bf16").
    pub accepted: &'static str,
    /// The SDK and host method it shares with the other operators of its
    /// args struct, if it does.
    pub group: Option<&'static str>,
    /// The args struct's fields after `struct_size`, in ABI order.
    pub fields: &'static [FieldInfo],
    /// The op table's one-line comment.
    pub doc: &'static str,
}

/// One field of an args struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldInfo {
    /// Its name.
    pub name: &'static str,
    /// What it holds.
    pub kind: FieldKind,
    /// Its byte offset in the args struct.
    pub offset: usize,
    /// For an output: the inputs it may be exactly (in place).
    pub alias: &'static [&'static str],
    /// For a tensor: whether a flag says it is absent.
    pub optional: bool,
}

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A tensor the operator only reads.
    In,
    /// A tensor the operator only writes.
    Out,
    /// A tensor the operator reads and writes (updated in place, or
    /// accumulated into).
    InOut,
    /// A `double`.
    F64,
    /// An `int64_t`.
    I64,
    /// An `int32_t`.
    I32,
    /// A `uint8_t` flag, nonzero meaning true.
    Flag,
}

impl FieldKind {
    /// Whether the field is a tensor.
    pub fn is_tensor(self) -> bool {
        matches!(self, FieldKind::In | FieldKind::Out | FieldKind::InOut)
    }

    /// Whether the field is a tensor the operator writes.
    pub fn is_output(self) -> bool {
        matches!(self, FieldKind::Out | FieldKind::InOut)
    }
}

impl Op {
    /// What the spec says of it.
    pub fn info(self) -> &'static OpInfo {
        &OPS[self as usize]
    }

    /// Its op-table slot.
    pub fn slot(self) -> usize {
        self as usize
    }

    /// The operator with this op-table name.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The dtypes it accepts for its `T` tensors.
    pub fn dtypes(self) -> &'static [DType] {
        self.info().dtypes
    }

    /// [`Op::dtypes`] as messages write them.
    pub fn accepted(self) -> &'static str {
        self.info().accepted
    }

    /// The ABI version that introduced it.
    pub fn since(self) -> (u32, u32) {
        self.info().since
    }

    /// The ABI version from which it takes `dtype` for its `T` tensors:
    /// [`Op::since`], or the later minor that added the dtype.
    pub fn dtype_since(self, dtype: DType) -> (u32, u32) {
        self.info()
            .added
            .iter()
            .find(|(d, _)| *d == dtype)
            .map_or(self.since(), |&(_, v)| v)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An ABI args struct that the SDK reads into its checked form (implemented
/// for every `Polychip*Args` by the generated code).
pub trait RawArgs {
    /// The checked form.
    type Checked<'a>
    where
        Self: 'a;

    /// Converts every tensor descriptor (naming the field of one that is
    /// malformed) and applies the spec's rules for a call of `op` on
    /// plugin device `device`.
    ///
    /// # Safety
    /// Every tensor descriptor's `shape` and `strides`, when non-NULL, point
    /// to `ndim` readable `i64`s that stay valid and unchanged while `self`
    /// is borrowed.
    unsafe fn check(&self, op: Op, device: u32) -> Result<Self::Checked<'_>, ArgError>;
}

pub(crate) fn unimplemented_op(op: &str) -> Error {
    Error::unimplemented(format!("{op} is not implemented by this plugin"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{POLYCHIP_ABI_MINOR, POLYCHIP_OP_COUNT, PolychipOpTable};

    #[test]
    fn the_list_matches_the_op_table() {
        assert_eq!(Op::ALL.len(), POLYCHIP_OP_COUNT);
        // SAFETY: an all-zero op table is valid (every entry None).
        let table: PolychipOpTable = unsafe { std::mem::zeroed() };
        for (op, (name, set)) in Op::ALL.into_iter().zip(table.entries()) {
            assert_eq!(op.name(), name);
            assert!(!set);
            assert_eq!(op.info().op, op);
            assert_eq!(Op::from_name(name), Some(op));
            assert!(
                op.since() <= (1, POLYCHIP_ABI_MINOR),
                "{op} is newer than the ABI"
            );
        }
        assert_eq!(
            Op::ALL.last().map(|op| op.since()),
            Some((1, POLYCHIP_ABI_MINOR)),
            "the newest operator belongs to the current minor"
        );
        assert_eq!(UnaryOp::Gelu.op(), Op::Gelu);
        assert_eq!(ReduceOp::Argmax.name(), "argmax");
        assert_eq!(Op::LogSoftmax.accepted(), "f32, f16 and bf16");
    }

    #[test]
    fn field_facts_come_from_the_spec() {
        let binary = Op::Add.info().fields;
        assert_eq!(
            binary.iter().map(|f| f.name).collect::<Vec<_>>(),
            ["a", "b", "out", "alpha"]
        );
        assert_eq!(binary[2].alias, ["a", "b"]);
        assert!(binary[2].kind.is_output());
        assert!(!binary[3].kind.is_tensor());
        let adamw = Op::Adamw.info().fields;
        assert_eq!(adamw[0].kind, FieldKind::InOut);
        assert!(
            Op::Linear
                .info()
                .fields
                .iter()
                .any(|f| f.name == "bias" && f.optional)
        );
    }
}
