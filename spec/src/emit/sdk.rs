//! `plugin-sdk/src/ops/generated.rs`: the operator list as Rust ([`Op`],
//! its facts, the enums of operators that share a method), each args
//! struct's checked form with the one constructor that checks it, and the
//! `Operators` trait a Rust plugin implements.

use std::fmt::Write;

use super::{banner, doc, dtype_path, field_doc, one_of, op_comment, variant};
use crate::model::{Args, DType, Field, Kind, Layout, Role, ScalarType, Shape, Spec};

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "Every operator as Rust: [`Op`] and what the spec says of it, the enums\n\
         //! of operators sharing a method, each args struct's checked form and\n\
         //! the constructor that checks it, and the [`Operators`] trait.",
    );
    out.push_str(
        "\n#![allow(clippy::too_many_arguments)]\n\n\
         use std::mem::{offset_of, size_of};\n\n\
         use crate::abi;\n\
         use crate::check::{self, ArgError, rules};\n\
         use crate::dtype::DType;\n\
         use crate::error::Result;\n\
         use crate::ops::{FieldInfo, FieldKind, OpInfo, RawArgs, unimplemented_op};\n\
         use crate::plugin::{Plugin, Queue};\n\
         use crate::tensor::TensorDesc;\n",
    );
    op_enum(&mut out, spec);
    for args in &spec.args {
        if let Some(name) = args.group_enum() {
            group_enum(&mut out, spec, args, &name);
        }
    }
    for args in &spec.args {
        safe_struct(&mut out, spec, args);
    }
    operators(&mut out, spec);
    out
}

fn op_enum(out: &mut String, spec: &Spec) {
    let n = spec.ops.len();
    out.push_str("\n/// Every operator of the op table, in slot order.\n");
    out.push_str(
        "#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]\npub enum Op {\n",
    );
    for op in &spec.ops {
        writeln!(out, "    /// `{}`: {}", op.name, op.doc).unwrap();
        writeln!(out, "    {},", variant(op)).unwrap();
    }
    out.push_str("}\n\nimpl Op {\n    /// Every operator, in slot order.\n");
    let all: Vec<String> = spec
        .ops
        .iter()
        .map(|o| format!("Op::{}", variant(o)))
        .collect();
    writeln!(
        out,
        "    pub const ALL: [Op; {n}] = [{}];\n",
        all.join(", ")
    )
    .unwrap();
    out.push_str("    /// Its name in the op table.\n    pub const fn name(self) -> &'static str {\n        match self {\n");
    for op in &spec.ops {
        writeln!(out, "            Op::{} => \"{}\",", variant(op), op.name).unwrap();
    }
    out.push_str("        }\n    }\n}\n");
    for args in &spec.args {
        writeln!(
            out,
            "\nconst {}_FIELDS: &[FieldInfo] = &[",
            args.snake().to_ascii_uppercase()
        )
        .unwrap();
        for f in &args.fields {
            writeln!(out, "    {},", field_info(args, f)).unwrap();
        }
        out.push_str("];\n");
    }
    writeln!(out, "\n/// What the spec says of each operator, in slot order.\npub(crate) static OPS: [OpInfo; {n}] = [").unwrap();
    for op in &spec.ops {
        let args = &spec.args[op.args];
        let dtypes: Vec<String> = op.dtypes.iter().map(|d| dtype_path(d)).collect();
        let added: Vec<String> = op
            .added
            .iter()
            .map(|(d, (major, minor))| format!("({}, ({major}, {minor}))", dtype_path(d)))
            .collect();
        writeln!(
            out,
            "    OpInfo {{ op: Op::{}, args: \"Polychip{}Args\", size: size_of::<abi::Polychip{1}Args>(), table_offset: offset_of!(abi::PolychipOpTable, {}), since: ({}, {}), family: \"{}\", dtypes: &[{}], added: &[{}], accepted: \"{}\", group: {}, fields: {}_FIELDS, doc: {:?} }},",
            variant(op),
            args.name,
            op.name,
            op.since.0,
            op.since.1,
            op.family,
            dtypes.join(", "),
            added.join(", "),
            super::list_and(&op.dtypes),
            args.group.as_ref().map_or("None".to_owned(), |g| format!("Some(\"{g}\")")),
            args.snake().to_ascii_uppercase(),
            op_comment(op),
        )
        .unwrap();
    }
    out.push_str("];\n");
}

fn field_info(args: &Args, f: &Field) -> String {
    let (kind, alias, optional) = match &f.kind {
        Kind::Tensor(t) => {
            let kind = match t.role {
                Role::In => "In",
                Role::Out => "Out",
                Role::InOut => "InOut",
            };
            let alias: Vec<String> = t.alias.iter().map(|a| format!("\"{a}\"")).collect();
            (
                kind,
                format!("&[{}]", alias.join(", ")),
                t.optional.is_some(),
            )
        }
        Kind::Scalar(s) => {
            let kind = match s.ty {
                ScalarType::F64 => "F64",
                ScalarType::I64 => "I64",
                ScalarType::I32 => "I32",
                ScalarType::Flag => "Flag",
            };
            (kind, "&[]".to_owned(), false)
        }
    };
    format!(
        "FieldInfo {{ name: \"{0}\", kind: FieldKind::{kind}, offset: offset_of!(abi::Polychip{1}Args, {0}), alias: {alias}, optional: {optional} }}",
        f.name, args.name
    )
}

fn group_enum(out: &mut String, spec: &Spec, args: &Args, name: &str) {
    let group = args.group.as_deref().expect("grouped");
    writeln!(
        out,
        "\n/// The operators that take [`{}Args`], told apart by [`Operators::{group}`]\n\
         /// and by the host's `Exec::{group}`.\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\npub enum {name} {{",
        args.name
    )
    .unwrap();
    for &i in &args.ops {
        writeln!(out, "    /// `{}`: {}", spec.ops[i].name, spec.ops[i].doc).unwrap();
        writeln!(out, "    {},", variant(&spec.ops[i])).unwrap();
    }
    let all: Vec<String> = args
        .ops
        .iter()
        .map(|&i| format!("{name}::{}", variant(&spec.ops[i])))
        .collect();
    writeln!(
        out,
        "}}\n\nimpl {name} {{\n    /// Every one, in op-table order.\n    pub const ALL: [{name}; {}] = [{}];\n",
        all.len(),
        all.join(", ")
    )
    .unwrap();
    out.push_str(
        "    /// The operator.\n    pub const fn op(self) -> Op {\n        match self {\n",
    );
    for &i in &args.ops {
        let v = variant(&spec.ops[i]);
        writeln!(out, "            {name}::{v} => Op::{v},").unwrap();
    }
    out.push_str(
        "        }\n    }\n\n    /// Its name in the op table.\n    pub const fn name(self) -> &'static str {\n        self.op().name()\n    }\n}\n",
    );
}

/// The type safe code sees for a field.
fn safe_type(f: &Field) -> &'static str {
    match &f.kind {
        Kind::Tensor(t) if t.optional.is_some() => "Option<TensorDesc<'a>>",
        Kind::Tensor(_) => "TensorDesc<'a>",
        Kind::Scalar(s) if s.dim_of.is_some() => "usize",
        Kind::Scalar(s) => s.ty.safe(),
    }
}

/// The constructor's parameter type (a dimension arrives as given).
fn param_type(f: &Field) -> &'static str {
    match f.scalar() {
        Some(s) if s.dim_of.is_some() => s.ty.safe(),
        _ => safe_type(f),
    }
}

fn safe_struct(out: &mut String, spec: &Spec, args: &Args) {
    let names: Vec<&str> = args
        .ops
        .iter()
        .map(|&i| spec.ops[i].name.as_str())
        .collect();
    let ops_text = names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    writeln!(
        out,
        "\n/// The checked arguments of {ops_text} (see [`abi::Polychip{}Args`]), as\n\
         /// [`{0}Args::new`] checks them with the spec's rules.\n\
         #[derive(Debug, Clone, Copy)]\npub struct {0}Args<'a> {{",
        args.name
    )
    .unwrap();
    for f in args.safe_fields() {
        let mut text = field_doc(f);
        if f.scalar().is_some_and(|s| s.dim_of.is_some()) {
            text.push_str(" Counted from the front here.");
        }
        doc(out, 4, &text);
        writeln!(out, "    pub {}: {},", f.name, safe_type(f)).unwrap();
    }
    writeln!(out, "}}\n\nimpl<'a> {}Args<'a> {{", args.name).unwrap();
    let params: Vec<String> = args
        .safe_fields()
        .map(|f| format!("{}: {}", f.name, param_type(f)))
        .collect();
    let rule_text = args.rule.as_ref().map_or(String::new(), |r| {
        format!(", then [`rules::{}`] ({r})", args.snake())
    });
    writeln!(
        out,
        "    /// Checks a call of `op` (one of {ops_text}): the spec's dtype, rank and\n\
         \x20   /// shape rules{rule_text}, then that no output overlaps itself, and\n\
         \x20   /// that the tensors share memory only where the operator works in place.\n\
         \x20   #[inline]\n\
         \x20   pub fn new(op: Op, {}) -> Result<Self, ArgError> {{\n\
         \x20       let name = op.name();",
        params.join(", ")
    )
    .unwrap();
    checks(out, spec, args);
    let fields: Vec<&str> = args.safe_fields().map(|f| f.name.as_str()).collect();
    writeln!(
        out,
        "        let args = {}Args {{ {} }};",
        args.name,
        fields.join(", ")
    )
    .unwrap();
    if args.rule.is_some() {
        writeln!(out, "        rules::{}(op, &args)?;", args.snake()).unwrap();
    }
    for f in &args.fields {
        if let Some(t) = f.tensor() {
            if t.role != Role::In {
                let source = format!("args.{}", f.name);
                let optional = t
                    .optional
                    .as_ref()
                    .map(|_| (f.name.as_str(), source.as_str()));
                let value = if optional.is_some() {
                    f.name.clone()
                } else {
                    source.clone()
                };
                guarded(
                    out,
                    optional,
                    &format!("check::writable(name, \"{}\", &{value})?;", f.name),
                );
            }
        }
    }
    apart(out, args);
    out.push_str("        Ok(args)\n    }\n");
    operands(out, args);
    out.push_str("}\n");
    raw_args(out, args);
}

/// The check that the call's tensors share memory only where the operator
/// works in place ([`check::apart`]): inputs, then outputs (written or
/// updated) with the inputs each may be exactly (the spec's `alias`).
fn apart(out: &mut String, args: &Args) {
    let tensors: Vec<(&Field, &crate::model::Tensor)> = args
        .fields
        .iter()
        .filter_map(|f| f.tensor().map(|t| (f, t)))
        .collect();
    let value = |f: &Field, t: &crate::model::Tensor| match t.optional {
        Some(_) => format!("args.{}.as_ref()", f.name),
        None => format!("Some(&args.{})", f.name),
    };
    let inputs: Vec<String> = tensors
        .iter()
        .filter(|(_, t)| t.role == Role::In)
        .map(|(f, t)| format!("(\"{}\", {})", f.name, value(f, t)))
        .collect();
    let outputs: Vec<String> = tensors
        .iter()
        .filter(|(_, t)| t.role != Role::In)
        .map(|(f, t)| {
            let aliases: Vec<String> = t.alias.iter().map(|a| format!("\"{a}\"")).collect();
            format!(
                "(\"{}\", {}, &[{}])",
                f.name,
                value(f, t),
                aliases.join(", ")
            )
        })
        .collect();
    if outputs.is_empty() || (outputs.len() == 1 && inputs.is_empty()) {
        return;
    }
    writeln!(
        out,
        "        check::apart(name, &[{}], &[{}])?;",
        inputs.join(", "),
        outputs.join(", ")
    )
    .unwrap();
}

/// Writes one check line; for an optional tensor, inside `if let Some(x) =
/// source` (a copy: `TensorDesc` is `Copy`).
fn guarded(out: &mut String, optional: Option<(&str, &str)>, line: &str) {
    match optional {
        Some((name, source)) => writeln!(
            out,
            "        if let Some({name}) = {source} {{\n            {line}\n        }}"
        )
        .unwrap(),
        None => writeln!(out, "        {line}").unwrap(),
    }
}

/// The generic rules, phase by phase.
fn checks(out: &mut String, spec: &Spec, args: &Args) {
    let tensors: Vec<(&Field, &crate::model::Tensor)> = args
        .fields
        .iter()
        .filter_map(|f| f.tensor().map(|t| (f, t)))
        .collect();
    let anchor = tensors
        .iter()
        .find(|(_, t)| t.dtype == DType::T)
        .map(|(f, _)| f.name.as_str());
    let all_any = args.ops.iter().all(|&i| spec.ops[i].any_dtype);
    // The operators that give a T field another dtype, with that dtype.
    let retyped = |field: &str| -> Vec<(String, &DType)> {
        args.ops
            .iter()
            .filter_map(|&i| {
                spec.ops[i]
                    .retype
                    .get(field)
                    .map(|d| (format!("Op::{}", variant(&spec.ops[i])), d))
            })
            .collect()
    };
    fn optional(f: &Field) -> Option<(&str, &str)> {
        f.tensor()
            .and_then(|t| t.optional.as_ref())
            .map(|_| (f.name.as_str(), f.name.as_str()))
    }
    let fixed = |name: &str, dtype: &DType| {
        let (set, text) = one_of(dtype).expect("a fixed dtype");
        format!("check::dtype_in(name, \"{name}\", &{name}, {set}, \"{text}\")?;")
    };
    // Phase 1: the T anchor against the operator's dtypes, and fixed dtypes
    // (including an operator's retyped fields).
    for (f, t) in &tensors {
        let n = f.name.as_str();
        match &t.dtype {
            DType::T if Some(n) == anchor => {
                if !all_any {
                    let line = format!(
                        "check::dtype_in(name, \"{n}\", &{n}, op.dtypes(), op.accepted())?;"
                    );
                    guarded(out, optional(f), &line);
                }
            }
            DType::T => {
                for (ops, dtype) in retyped(n) {
                    guarded(
                        out,
                        optional(f),
                        &format!("if op == {ops} {{ {} }}", fixed(n, dtype)),
                    );
                }
            }
            dtype => guarded(out, optional(f), &fixed(n, dtype)),
        }
    }
    // Phase 2: every other T tensor has the anchor's dtype.
    for (f, t) in &tensors {
        let n = f.name.as_str();
        if t.dtype != DType::T || Some(n) == anchor {
            continue;
        }
        let a = anchor.expect("a T field makes an anchor");
        let line = format!("check::same_dtype(name, (\"{a}\", &{a}), (\"{n}\", &{n}))?;");
        let excluded: Vec<String> = retyped(n).into_iter().map(|(o, _)| o).collect();
        let line = if excluded.is_empty() {
            line
        } else {
            format!("if !matches!(op, {}) {{ {line} }}", excluded.join(" | "))
        };
        guarded(out, optional(f), &line);
    }
    // Phase 3: ranks.
    for (f, t) in &tensors {
        if let Some(layout) = &t.layout {
            guarded(out, optional(f), &rank_line(&f.name, layout));
        }
    }
    // Phase 4: shapes relative to other tensors.
    for (f, t) in &tensors {
        let n = f.name.as_str();
        let line = match &t.shape {
            None => continue,
            Some(Shape::Like(x)) => {
                format!("check::shape_like(name, (\"{n}\", &{n}), (\"{x}\", &{x}))?;")
            }
            Some(Shape::Last(x)) => {
                format!("check::shape_last(name, (\"{n}\", &{n}), (\"{x}\", &{x}))?;")
            }
            Some(Shape::Rows(x)) => {
                format!("check::shape_rows(name, (\"{n}\", &{n}), (\"{x}\", &{x}))?;")
            }
            Some(Shape::Broadcast(xs)) if xs.len() == 2 => {
                let (a, b) = (&xs[0], &xs[1]);
                format!(
                    "check::shape_broadcast(name, (\"{n}\", &{n}), (\"{a}\", &{a}), (\"{b}\", &{b}))?;"
                )
            }
            Some(Shape::Broadcast(xs)) => {
                let list: Vec<String> = xs.iter().map(|x| format!("(\"{x}\", &{x})")).collect();
                format!(
                    "check::shape_broadcast_all(name, (\"{n}\", &{n}), &[{}])?;",
                    list.join(", ")
                )
            }
            Some(Shape::BroadcastsTo(x)) => {
                format!("check::shape_broadcasts_to(name, (\"{n}\", &{n}), (\"{x}\", &{x}))?;")
            }
        };
        guarded(out, optional(f), &line);
    }
    // Phase 5: dimension arguments, normalised.
    for f in &args.fields {
        if let Some(x) = f.scalar().and_then(|s| s.dim_of.as_ref()) {
            writeln!(
                out,
                "        let {0} = check::dim_of(name, (\"{x}\", &{x}), {0})?;",
                f.name
            )
            .unwrap();
        }
    }
}

fn rank_line(name: &str, layout: &Layout) -> String {
    if layout.open {
        format!(
            "check::min_rank(name, \"{name}\", &{name}, {})?;",
            layout.dims
        )
    } else {
        let what = if layout.dims == 0 {
            "0-dimensional"
        } else {
            &layout.text
        };
        format!(
            "check::rank(name, \"{name}\", &{name}, {}, \"{what}\")?;",
            layout.dims
        )
    }
}

/// `operands()` and `outputs()`, for structs whose tensors are all present:
/// the tensors with their names, inputs first, then what the operator
/// writes, each in field order (the shape a kernel launcher wants).
fn operands(out: &mut String, args: &Args) {
    let tensors: Vec<(&Field, &crate::model::Tensor)> = args
        .fields
        .iter()
        .filter_map(|f| f.tensor().map(|t| (f, t)))
        .collect();
    if tensors.iter().any(|(_, t)| t.optional.is_some()) {
        return;
    }
    let inputs = tensors.iter().filter(|(_, t)| t.role == Role::In);
    let outputs = tensors.iter().filter(|(_, t)| t.role != Role::In);
    let n_out = outputs.clone().count();
    let list: Vec<String> = inputs
        .chain(outputs)
        .map(|(f, _)| format!("(\"{0}\", &self.{0})", f.name))
        .collect();
    writeln!(
        out,
        "\n    /// The tensors with their names: inputs first, then the {n_out} the\n\
         \x20   /// operator writes, each in field order.\n\
         \x20   pub fn operands(&self) -> [(&'static str, &TensorDesc<'a>); {}] {{\n        [{}]\n    }}\n\n\
         \x20   /// How many of [`Self::operands`] (the last ones) the operator writes.\n\
         \x20   pub fn outputs(&self) -> usize {{\n        {n_out}\n    }}",
        list.len(),
        list.join(", ")
    )
    .unwrap();
}

fn raw_args(out: &mut String, args: &Args) {
    writeln!(
        out,
        "\nimpl RawArgs for abi::Polychip{0}Args {{\n    type Checked<'a> = {0}Args<'a>;\n\n\
         \x20   #[inline]\n\
         \x20   unsafe fn check(&self, op: Op, device: u32) -> Result<{0}Args<'_>, ArgError> {{\n\
         \x20       let name = op.name();\n\
         \x20       // SAFETY: per this trait's contract, every descriptor in `self` is\n\
         \x20       // valid for the borrow; the dimension arrays outlive it.\n\
         \x20       unsafe {{\n            {0}Args::new(\n                op,",
        args.name
    )
    .unwrap();
    for f in args.safe_fields() {
        let value = match &f.kind {
            Kind::Tensor(t) => match &t.optional {
                Some(flag) => format!(
                    "if self.{flag} != 0 {{ Some(TensorDesc::from_raw(name, \"{0}\", device, &self.{0})?) }} else {{ None }}",
                    f.name
                ),
                None => format!(
                    "TensorDesc::from_raw(name, \"{0}\", device, &self.{0})?",
                    f.name
                ),
            },
            Kind::Scalar(s) if s.ty == ScalarType::Flag => format!("self.{} != 0", f.name),
            Kind::Scalar(_) => format!("self.{}", f.name),
        };
        writeln!(out, "                {value},").unwrap();
    }
    out.push_str("            )\n        }\n    }\n}\n");
}

fn operators(out: &mut String, spec: &Spec) {
    out.push_str(
        "\n/// The operators of a Rust plugin, one method per op-table entry (one per\n\
         /// group for operators that share one, with an enum saying which). Every\n\
         /// method has a default that reports \"not implemented\"; a plugin\n\
         /// overrides those it lists in [`crate::export_plugin!`]. The SDK has\n\
         /// checked the arguments with the spec's rules before a method runs.\n\
         pub trait Operators: Plugin {\n",
    );
    let safety = "    ///\n    /// # Safety\n    /// Every tensor in `args` addresses valid memory of this device (the\n    /// host's side of the ABI contract).\n";
    let mut done = Vec::new();
    for op in &spec.ops {
        let args = &spec.args[op.args];
        if let Some(group) = &args.group {
            if done.contains(group) {
                continue;
            }
            done.push(group.clone());
            let members: Vec<String> = args
                .ops
                .iter()
                .map(|&i| format!("`{}`", spec.ops[i].name))
                .collect();
            writeln!(
                out,
                "    /// {} (told apart by `op`). Since {}.{}.",
                members.join(", "),
                args.since.0,
                args.since.1
            )
            .unwrap();
            out.push_str(safety);
            writeln!(
                out,
                "    unsafe fn {group}(&self, queue: Queue<'_, Self::Stream>, op: {}, args: &{}Args<'_>) -> Result<()> {{\n\
                 \x20       let _ = (queue, args);\n        Err(unimplemented_op(op.name()))\n    }}",
                args.group_enum().expect("grouped"),
                args.name
            )
            .unwrap();
        } else {
            writeln!(out, "    /// `{}`: {}", op.name, op_comment(op)).unwrap();
            out.push_str(safety);
            writeln!(
                out,
                "    unsafe fn {0}(&self, queue: Queue<'_, Self::Stream>, args: &{1}Args<'_>) -> Result<()> {{\n\
                 \x20       let _ = (queue, args);\n        Err(unimplemented_op(\"{0}\"))\n    }}",
                op.name, args.name
            )
            .unwrap();
        }
    }
    out.push_str("}\n");
}
