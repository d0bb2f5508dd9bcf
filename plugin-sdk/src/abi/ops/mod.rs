//! The operator table and each operator's argument struct.
//!
//! Every item here is derived from `spec/ops.toml` by `polychip-spec`
//! (`generated.rs`); this file holds only the rules common to all of them.
//!
//! Every operator entry has the same shape:
//! `PolychipError *op(uint32_t device, PolychipStream *stream, const Polychip<Op>Args *args)`.
//! `stream` NULL means the device's default stream, on which work completes
//! before the call returns. Each `*Args` struct starts with `struct_size`, so
//! an operator gains optional arguments at the end without a new entry. Every
//! field present when its struct was introduced is required (`struct_size`
//! must cover it); a field appended by a later minor documents the default a
//! plugin uses when `args->struct_size` does not reach it.
//!
//! A NULL entry means "not implemented". Entries are only ever appended to
//! [`PolychipOpTable`], so a table from an older minor is a prefix of a newer
//! one; the host reads an entry only when `struct_size` covers it.
//!
//! Common rules for all operators:
//! - all tensors are on `device`; outputs are written, inputs are only read;
//! - an output may alias an input only where its field says "in place";
//! - floating operators compute f16 and bf16 in at least f32 precision and
//!   round to nearest even once per output element;
//! - an output must not overlap itself (a zero stride on an extent above one,
//!   or strides that reach one element twice); the host never passes one and
//!   a plugin may refuse it with `POLYCHIP_ERROR_INVALID_ARGUMENT`;
//! - thread safety: calls on different streams may run concurrently; calls on
//!   one stream must be serialized by the caller.

#[rustfmt::skip]
mod generated;

pub use generated::*;
