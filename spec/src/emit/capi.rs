//! `capi/src/ops/generated.rs`: one C function per operator,
//! `polychip_op_<name>`, each looking up its handles and running the host's
//! checked call.

use std::fmt::Write;

use super::{banner, op_comment};
use crate::model::{Args, Field, Kind, Op, Spec};

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "The operators of the C API: `polychip_op_<name>` for every op-table\n\
         //! entry, with the arguments of its ABI args struct as handles and\n\
         //! scalars, checked by the host exactly as Rust callers are.",
    );
    out.push_str(
        "\n#![allow(clippy::too_many_arguments)]\n\n\
         use polychip_host::*;\n\n\
         use super::{optional, with_exec};\n\
         use crate::error::{guard, polychip_error_t};\n\
         use crate::stream::{polychip_stream_t, stream_arg};\n\
         use crate::tensor::{polychip_tensor_t, tensor as tensor_arg};\n",
    );
    for op in &spec.ops {
        function(&mut out, &spec.args[op.args], op);
    }
    out
}

fn scalars(args: &Args) -> impl Iterator<Item = &Field> {
    args.safe_fields().filter(|f| f.scalar().is_some())
}

fn function(out: &mut String, args: &Args, op: &Op) {
    let tensors: Vec<&Field> = args
        .fields
        .iter()
        .filter(|f| f.tensor().is_some())
        .collect();
    let mut params = vec!["stream: *const polychip_stream_t".to_owned()];
    params.extend(
        tensors
            .iter()
            .map(|f| format!("{}: *const polychip_tensor_t", f.name)),
    );
    params.extend(
        scalars(args).map(|f| format!("{}: {}", f.name, f.scalar().expect("scalar").ty.safe())),
    );
    let optional_names: Vec<&str> = tensors
        .iter()
        .filter(|f| f.tensor().is_some_and(|t| t.optional.is_some()))
        .map(|f| f.name.as_str())
        .collect();
    writeln!(
        out,
        "\n/// `{}`: {}\n///\n\
         /// The arguments are those of `Polychip{}Args` (include/polychip.h){}.\n\
         /// `stream` NULL runs on the default stream of the first tensor's\n\
         /// device, and the call returns when the work is done.\n\
         ///\n\
         /// Thread safety: any thread; calls on one stream must not run concurrently.",
        op.name,
        op_comment(op),
        args.name,
        if optional_names.is_empty() {
            String::new()
        } else {
            format!(", `{}` NULL when absent", optional_names.join("`, `"))
        }
    )
    .unwrap();
    writeln!(
        out,
        "#[unsafe(no_mangle)]\npub extern \"C\" fn polychip_op_{}({}) -> *mut polychip_error_t {{\n    guard(\"polychip_op_{0}\", || {{",
        op.name,
        params.join(", ")
    )
    .unwrap();
    for f in &tensors {
        let optional = f.tensor().is_some_and(|t| t.optional.is_some());
        let lookup = if optional { "optional" } else { "tensor_arg" };
        writeln!(out, "        let {0} = {lookup}({0}, \"{0}\")?;", f.name).unwrap();
    }
    let first = tensors
        .iter()
        .find(|f| f.tensor().is_some_and(|t| t.optional.is_none()))
        .expect("a tensor");
    writeln!(out, "        let stream = stream_arg(stream)?;").unwrap();
    let mut call: Vec<String> = tensors
        .iter()
        .map(|f| match &f.kind {
            Kind::Tensor(t) if t.optional.is_some() => {
                format!("{}.as_deref().map(|t| &t.tensor)", f.name)
            }
            _ => format!("&{}.tensor", f.name),
        })
        .collect();
    match &args.options {
        Some(name) => {
            let names: Vec<&str> = scalars(args).map(|f| f.name.as_str()).collect();
            call.push(format!("{name} {{ {} }}", names.join(", ")));
        }
        None => call.extend(scalars(args).map(|f| f.name.clone())),
    }
    writeln!(
        out,
        "        with_exec(stream.as_deref(), &{}.tensor, |exec| Ok(exec.{}({})?))\n    }})\n}}",
        first.name,
        op.name,
        call.join(", ")
    )
    .unwrap();
}
