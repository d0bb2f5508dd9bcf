//! `fuzz/src/op_args/generated.rs`: the `op_args` fuzz target's dispatch
//! from an operator to its ABI args struct (the one place a type, not a
//! name, is needed: the SDK's `RawArgs::check` is generic over it), so a
//! new operator or args struct in the spec needs no hand edit in the fuzz
//! crate.

use std::fmt::Write;

use super::{banner, variant};
use crate::model::Spec;

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "The `op_args` fuzz target's table: each operator's ABI args struct as\n\
         //! a type, for `RawArgs::check` (the match is exhaustive, so an operator\n\
         //! the SDK has and this file lacks does not compile).",
    );
    out.push_str("\nuse polychip_plugin_sdk::{Op, abi};\n\nuse super::{Bytes, check};\n");
    out.push_str(
        "\n\
         /// Fills the args struct of `op` from the bytes and checks it (see\n\
         /// [`check`]); returns the struct's name.\n\
         pub(super) fn dispatch(op: Op, b: &mut Bytes<'_>) -> &'static str {\n    match op {\n",
    );
    for op in &spec.ops {
        writeln!(
            out,
            "        Op::{} => check::<abi::Polychip{}Args>(op, b),",
            variant(op),
            spec.args[op.args].name
        )
        .unwrap();
    }
    out.push_str("    }\n}\n");
    out
}
