//! `host/src/ops/generated.rs`: the host's call of every operator. Each
//! method checks that its tensors are on the call's device, applies the
//! SDK's checked constructor (the same rules the SDK applies on the plugin's
//! side), builds the ABI args struct and calls the plugin's entry.

use std::fmt::Write;

use super::{banner, doc, op_comment, variant};
use crate::model::{Args, Field, Kind, Op, ScalarType, Spec};

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "Every operator's call on an [`Exec`]: one method per operator, named like\n\
         //! its op-table entry, and one per group of operators sharing an args\n\
         //! struct (`unary`, `binary`, ...) taking an enum that says which.",
    );
    out.push_str(
        "\n#![allow(clippy::too_many_arguments)]\n\nuse std::mem::size_of;\n\n\
         use polychip_plugin_sdk::abi::*;\n\
         use polychip_plugin_sdk::*;\n\n\
         use crate::error::Result;\n\
         use crate::ops::Exec;\n\
         use crate::tensor::Tensor;\n",
    );
    for args in &spec.args {
        if let Some(name) = &args.options {
            options(&mut out, args, name);
        }
    }
    out.push_str("\nimpl Exec<'_> {");
    let mut groups = Vec::new();
    for op in &spec.ops {
        let args = &spec.args[op.args];
        match &args.group {
            Some(group) => {
                if !groups.contains(group) {
                    groups.push(group.clone());
                    dispatcher(&mut out, spec, args, group);
                }
                member(&mut out, args, op, group);
            }
            None => single(&mut out, args, op),
        }
    }
    out.push_str("}\n");
    out
}

fn scalars(args: &Args) -> impl Iterator<Item = &Field> {
    args.safe_fields().filter(|f| f.scalar().is_some())
}

fn options(out: &mut String, args: &Args, name: &str) {
    writeln!(
        out,
        "\n/// The scalars of [`Polychip{}Args`], for [`Exec::{}`].\n\
         #[derive(Debug, Clone, Copy, PartialEq)]\npub struct {name} {{",
        args.name,
        args.snake()
    )
    .unwrap();
    for f in scalars(args) {
        doc(out, 4, &f.doc);
        writeln!(
            out,
            "    pub {}: {},",
            f.name,
            f.scalar().expect("scalar").ty.safe()
        )
        .unwrap();
    }
    out.push_str("}\n");
    let defaults: Option<Vec<String>> = scalars(args)
        .map(|f| {
            f.scalar()
                .and_then(|s| s.default.clone())
                .map(|d| format!("{}: {d}", f.name))
        })
        .collect();
    if let Some(defaults) = defaults {
        writeln!(
            out,
            "\nimpl Default for {name} {{\n    fn default() -> Self {{\n        {name} {{ {} }}\n    }}\n}}",
            defaults.join(", ")
        )
        .unwrap();
    }
}

/// The method's parameters after `&self` (and after `op` for a dispatcher).
fn params(args: &Args) -> Vec<String> {
    let mut params: Vec<String> = args
        .fields
        .iter()
        .filter_map(|f| {
            f.tensor().map(|t| {
                if t.optional.is_some() {
                    format!("{}: Option<&Tensor>", f.name)
                } else {
                    format!("{}: &Tensor", f.name)
                }
            })
        })
        .collect();
    match &args.options {
        Some(name) => params.push(format!("options: {name}")),
        None => params.extend(
            scalars(args).map(|f| format!("{}: {}", f.name, f.scalar().expect("scalar").ty.safe())),
        ),
    }
    params
}

/// The arguments passed on to the method (tensors by name, then scalars).
fn arg_names(args: &Args) -> Vec<String> {
    let mut names: Vec<String> = args
        .fields
        .iter()
        .filter(|f| f.tensor().is_some())
        .map(|f| f.name.clone())
        .collect();
    match &args.options {
        Some(_) => names.push("options".to_owned()),
        None => names.extend(scalars(args).map(|f| f.name.clone())),
    }
    names
}

/// The body shared by every call of `args`: `op` and `entry` are in scope.
/// `added`: whether one of its operators took on dtypes in a later minor
/// (the call then checks the plugin's minor for the `T` tensor's dtype).
fn body(out: &mut String, args: &Args, added: bool) {
    let present: Vec<&Field> = args
        .fields
        .iter()
        .filter(|f| f.tensor().is_some_and(|t| t.optional.is_none()))
        .collect();
    let optional: Vec<&Field> = args
        .fields
        .iter()
        .filter(|f| f.tensor().is_some_and(|t| t.optional.is_some()))
        .collect();
    if let Some(name) = &args.options {
        let names: Vec<&str> = scalars(args).map(|f| f.name.as_str()).collect();
        writeln!(
            out,
            "        let {name} {{ {} }} = options;",
            names.join(", ")
        )
        .unwrap();
    }
    let list: Vec<String> = present
        .iter()
        .map(|f| format!("(\"{0}\", {0})", f.name))
        .collect();
    writeln!(out, "        let tensors = [{}];", list.join(", ")).unwrap();
    out.push_str("        self.on_device(op.name(), &tensors)?;\n");
    for f in &optional {
        writeln!(out, "        if let Some({0}) = {0} {{\n            self.on_device(op.name(), &[(\"{0}\", {0})])?;\n        }}", f.name).unwrap();
    }
    let checked: Vec<String> = args
        .safe_fields()
        .map(|f| match &f.kind {
            Kind::Tensor(t) if t.optional.is_some() => format!("{}.map(Tensor::desc)", f.name),
            Kind::Tensor(_) => format!("{}.desc()", f.name),
            Kind::Scalar(_) => f.name.clone(),
        })
        .collect();
    writeln!(
        out,
        "        {}Args::new(op, {}).map_err(|e| self.invalid(e))?;",
        args.name,
        checked.join(", ")
    )
    .unwrap();
    if added {
        let anchor = args
            .fields
            .iter()
            .find(|f| {
                f.tensor()
                    .is_some_and(|t| t.dtype == crate::model::DType::T)
            })
            .expect("an operator with added dtypes has T tensors");
        writeln!(out, "        self.dtype_since(op, {})?;", anchor.name).unwrap();
    }
    let mut raw = vec![format!(
        "struct_size: size_of::<Polychip{}Args>()",
        args.name
    )];
    for f in &args.fields {
        raw.push(match &f.kind {
            Kind::Tensor(t) if t.optional.is_some() => format!(
                "{0}: {0}.map_or_else(|| self.absent(), Tensor::raw)",
                f.name
            ),
            Kind::Tensor(_) => format!("{0}: {0}.raw()", f.name),
            Kind::Scalar(_) if args.is_presence_flag(&f.name) => {
                let tensor = args
                    .fields
                    .iter()
                    .find(|t| {
                        t.tensor()
                            .is_some_and(|t| t.optional.as_deref() == Some(f.name.as_str()))
                    })
                    .expect("a presence flag has its tensor");
                format!("{}: u8::from({}.is_some())", f.name, tensor.name)
            }
            Kind::Scalar(s) if s.ty == ScalarType::Flag => format!("{0}: u8::from({0})", f.name),
            Kind::Scalar(_) => f.name.clone(),
        });
    }
    writeln!(
        out,
        "        let raw = Polychip{}Args {{ {} }};",
        args.name,
        raw.join(", ")
    )
    .unwrap();
    if optional.is_empty() {
        out.push_str("        self.call(op.name(), entry, &raw, &tensors)\n");
    } else {
        out.push_str("        self.call(op.name(), entry, &raw, &tensors)?;\n");
        for f in &optional {
            writeln!(
                out,
                "        if let Some({0}) = {0} {{\n            self.pin({0});\n        }}",
                f.name
            )
            .unwrap();
        }
        out.push_str("        Ok(())\n");
    }
}

fn single(out: &mut String, args: &Args, op: &Op) {
    writeln!(out, "\n    /// `{}`: {}", op.name, op_comment(op)).unwrap();
    args_doc(out, args);
    writeln!(
        out,
        "    pub fn {}(&self, {}) -> Result<()> {{\n        let op = Op::{};\n        let entry = self.ops().{};",
        op.name,
        params(args).join(", "),
        variant(op),
        op.name
    )
    .unwrap();
    body(out, args, !op.added.is_empty());
    out.push_str("    }\n");
}

fn args_doc(out: &mut String, args: &Args) {
    writeln!(
        out,
        "    ///\n    /// The arguments are those of [`Polychip{}Args`].",
        args.name
    )
    .unwrap();
}

fn dispatcher(out: &mut String, spec: &Spec, args: &Args, group: &str) {
    let name = args.group_enum().expect("grouped");
    let members: Vec<String> = args
        .ops
        .iter()
        .map(|&i| format!("`{}`", spec.ops[i].name))
        .collect();
    writeln!(out, "\n    /// {}, as `op` says.", members.join(", ")).unwrap();
    args_doc(out, args);
    writeln!(
        out,
        "    pub fn {group}(&self, op: {name}, {}) -> Result<()> {{\n        let ops = self.ops();\n        let entry = match op {{",
        params(args).join(", ")
    )
    .unwrap();
    for &i in &args.ops {
        writeln!(
            out,
            "            {name}::{} => ops.{},",
            variant(&spec.ops[i]),
            spec.ops[i].name
        )
        .unwrap();
    }
    out.push_str("        };\n        let op = op.op();\n");
    let added = args.ops.iter().any(|&i| !spec.ops[i].added.is_empty());
    body(out, args, added);
    out.push_str("    }\n");
}

fn member(out: &mut String, args: &Args, op: &Op, group: &str) {
    writeln!(out, "\n    /// `{}`: {}", op.name, op_comment(op)).unwrap();
    args_doc(out, args);
    writeln!(
        out,
        "    pub fn {}(&self, {}) -> Result<()> {{\n        self.{group}({}::{}, {})\n    }}",
        op.name,
        params(args).join(", "),
        args.group_enum().expect("grouped"),
        variant(op),
        arg_names(args).join(", ")
    )
    .unwrap();
}
