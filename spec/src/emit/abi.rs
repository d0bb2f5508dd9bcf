//! `plugin-sdk/src/abi/ops/generated.rs`: the `#[repr(C)]` args structs,
//! the entry function types, the op table and its name list. Plain Rust
//! items only, so cbindgen writes them into `include/polychip.h`.

use std::fmt::Write;

use super::{banner, doc, field_doc, op_comment};
use crate::model::{Kind, Spec};

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "The op table and every operator's args struct (the rules common to all\n\
         //! operators are in `abi/ops/mod.rs`).",
    );
    out.push_str("\nuse crate::abi::{PolychipError, PolychipStream, PolychipTensor};\n");
    for args in &spec.args {
        out.push('\n');
        doc(&mut out, 0, &args.doc);
        writeln!(
            out,
            "#[repr(C)]\n#[derive(Debug, Clone, Copy)]\npub struct Polychip{}Args {{",
            args.name
        )
        .unwrap();
        out.push_str(
            "    /// Size of this struct as the host knows it.\n    pub struct_size: usize,\n",
        );
        for f in &args.fields {
            doc(&mut out, 4, &field_doc(f));
            let ty = match &f.kind {
                Kind::Tensor(_) => "PolychipTensor",
                Kind::Scalar(s) => s.ty.abi(),
            };
            writeln!(out, "    pub {}: {ty},", f.name).unwrap();
        }
        out.push_str("}\n\n");
        writeln!(
            out,
            "/// An operator entry taking [`Polychip{0}Args`].\n\
             pub type Polychip{0}Fn = Option<unsafe extern \"C\" fn(device: u32, stream: *mut PolychipStream, args: *const Polychip{0}Args) -> *mut PolychipError>;",
            args.name
        )
        .unwrap();
    }
    out.push_str(
        "\n/// The operator table. Append-only: a new operator is a new field at the end,\n\
         /// introduced by a new minor version. NULL entries are \"not implemented\".\n\
         #[repr(C)]\n#[derive(Debug, Clone, Copy)]\npub struct PolychipOpTable {\n\
         \x20   /// Size of this table as the plugin knows it.\n    pub struct_size: usize,\n",
    );
    for op in &spec.ops {
        doc(&mut out, 4, &op_comment(op));
        writeln!(
            out,
            "    pub {}: Polychip{}Fn,",
            op.name, spec.args[op.args].name
        )
        .unwrap();
    }
    out.push_str("}\n\n");
    writeln!(
        out,
        "/// The number of operators in this minor's op table.\npub const POLYCHIP_OP_COUNT: usize = {};\n",
        spec.ops.len()
    )
    .unwrap();
    out.push_str(
        "impl PolychipOpTable {\n\
         \x20   /// Every operator's name, in table order, with whether its entry is set.\n\
         \x20   pub fn entries(&self) -> [(&'static str, bool); POLYCHIP_OP_COUNT] {\n        [\n",
    );
    for op in &spec.ops {
        writeln!(out, "            (\"{0}\", self.{0}.is_some()),", op.name).unwrap();
    }
    out.push_str("        ]\n    }\n}\n");
    out
}

/// The `[export] exclude` line of `plugin-sdk/cbindgen.toml`: the SDK's
/// Rust-only types with associated constants, which cbindgen would
/// otherwise announce to every vendor as opaque C types.
pub(super) fn cbindgen_exclude(spec: &Spec) -> String {
    let mut names = vec![
        "POLYCHIP_PLUGIN_INIT_V1_SYMBOL".to_owned(),
        "DType".to_owned(),
        "Op".to_owned(),
    ];
    names.extend(spec.args.iter().filter_map(|a| a.group_enum()));
    let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("\nexclude = [{}]\n", quoted.join(", "))
}
