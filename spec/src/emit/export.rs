//! `plugin-sdk/src/export/generated.rs`: one `extern "C"` entry per
//! operator, each a call of the SDK's one generic shim.

use std::fmt::Write;

use super::{banner, variant};
use crate::model::Spec;

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "One `extern \"C\"` entry per operator, named like its op-table field. Each\n\
         //! is [`super::call`] (read the args struct, check it with the spec's\n\
         //! rules, call the plugin inside the panic firewall) with the\n\
         //! [`Operators`] method to run; [`crate::export_plugin!`] puts\n\
         //! `Some(generated::name::<P>)` in the table for each operator a plugin lists.",
    );
    out.push_str(
        "\nuse super::call;\nuse crate::abi::{self, PolychipError, PolychipStream};\nuse crate::ops::*;\n",
    );
    for op in &spec.ops {
        let args = &spec.args[op.args];
        let method = match &args.group {
            Some(group) => format!(
                "p.{group}(q, {}::{}, a)",
                args.group_enum().expect("grouped"),
                variant(op)
            ),
            None => format!("p.{}(q, a)", op.name),
        };
        writeln!(
            out,
            "\n/// The `{0}` entry.\n\
             ///\n\
             /// # Safety\n\
             /// The ABI's operator contract (see [`call`]).\n\
             pub unsafe extern \"C\" fn {0}<P: Operators>(device: u32, stream: *mut PolychipStream, args: *const abi::Polychip{1}Args) -> *mut PolychipError {{\n\
             \x20   // SAFETY: the caller keeps the operator contract, which `call` requires\n\
             \x20   // and which makes the checked tensors valid for the method.\n\
             \x20   unsafe {{ call::<P, _>(Op::{2}, device, stream, args, |p, q, a| {method}) }}\n\
             }}",
            op.name,
            args.name,
            variant(op),
        )
        .unwrap();
    }
    out
}
