//! The operator tables of `docs/abi.md`, between its `operators` markers.

use std::fmt::Write;

use super::{dtypes_text, list};
use crate::model::{DType, Kind, Role, Shape, Spec};

pub(super) fn emit(spec: &Spec) -> String {
    let mut out = String::new();
    out.push_str(
        "\nGenerated from [`spec/ops.toml`](../spec/ops.toml) by `cargo run -p polychip-spec`; do not edit here.\n\n\
         | slot | entry | since | family | args | dtypes (`T`) | in place |\n|---|---|---|---|---|---|---|\n",
    );
    for (slot, op) in spec.ops.iter().enumerate() {
        let args = &spec.args[op.args];
        let fields: Vec<&str> = args.fields.iter().map(|f| f.name.as_str()).collect();
        let mut aliases = Vec::new();
        for f in &args.fields {
            if let Some(t) = f.tensor() {
                if !t.alias.is_empty() {
                    let names: Vec<String> = t.alias.iter().map(|a| format!("`{a}`")).collect();
                    aliases.push(format!("`{}` may be {}", f.name, list(&names, "or")));
                }
                if t.role == Role::InOut {
                    aliases.push(format!("`{}` is updated", f.name));
                }
            }
        }
        let mut dtypes = dtypes_text(op);
        for (field, dtype) in &op.retype {
            if let DType::OneOf(_, list_) = dtype {
                write!(dtypes, "; `{field}` {}", list(list_, "or")).unwrap();
            }
        }
        writeln!(
            out,
            "| {slot} | `{}` | {}.{} | {} | `Polychip{}Args {{ {} }}` | {dtypes} | {} |",
            op.name,
            op.since.0,
            op.since.1,
            op.family,
            args.name,
            fields.join(", "),
            aliases.join("; ")
        )
        .unwrap();
    }
    out.push_str(
        "\nThe rules the host and the SDK check for each args struct, beyond every\n\
         output not overlapping itself and the tensors of a call sharing memory\n\
         only in place (each output apart from every other output, and from every\n\
         input unless it is exactly an input the spec's `alias` lets it be; views\n\
         that interleave without a common byte, such as a matrix's even and odd\n\
         columns, are apart) (`T`: the operator's dtype; a tensor with no rule may\n\
         have any shape):\n\n\
         | args | tensors | scalars | and |\n|---|---|---|---|\n",
    );
    for args in &spec.args {
        let mut tensors = Vec::new();
        let mut scalars = Vec::new();
        for f in args.safe_fields() {
            match &f.kind {
                Kind::Tensor(t) => {
                    let mut rule = vec![match &t.dtype {
                        DType::T => "T".to_owned(),
                        DType::OneOf(_, dtypes) => list(dtypes, "or"),
                    }];
                    if let Some(layout) = &t.layout {
                        rule.push(format!("`{}`", layout.text));
                    }
                    match &t.shape {
                        Some(Shape::Like(x)) => rule.push(format!("like `{x}`")),
                        Some(Shape::Last(x)) => rule.push(format!("`[H]`, H = `{x}`'s last")),
                        Some(Shape::Rows(x)) => rule.push(format!("`{x}`'s rows")),
                        Some(Shape::Broadcast(xs)) => {
                            let xs: Vec<String> = xs.iter().map(|x| format!("`{x}`")).collect();
                            rule.push(format!("broadcast of {}", xs.join(", ")))
                        }
                        Some(Shape::BroadcastsTo(x)) => rule.push(format!("broadcasts to `{x}`")),
                        None => {}
                    }
                    if t.optional.is_some() {
                        rule.push("optional".to_owned());
                    }
                    let role = match t.role {
                        Role::In => "",
                        Role::Out => "out ",
                        Role::InOut => "inout ",
                    };
                    tensors.push(format!("{role}`{}`: {}", f.name, rule.join(", ")));
                }
                Kind::Scalar(s) => {
                    let mut text = format!("`{}`: {}", f.name, s.ty.safe());
                    if let Some(x) = &s.dim_of {
                        write!(text, ", a dimension of `{x}`").unwrap();
                    }
                    scalars.push(text);
                }
            }
        }
        writeln!(
            out,
            "| `Polychip{}Args` | {} | {} | {} |",
            args.name,
            tensors.join("; "),
            scalars.join("; "),
            args.rule.as_deref().unwrap_or("")
        )
        .unwrap();
    }
    out.push('\n');
    out
}
