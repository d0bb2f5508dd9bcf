//! The Python package's operators: `python/src/ops/generated.rs` (one
//! pyo3 function per operator over `polychip_op_<name>`, releasing the GIL)
//! and `python/polychip/ops.pyi` (their typed signatures and docs).

use std::fmt::Write;

use super::{banner, op_comment};
use crate::model::{Args, Field, Op, ScalarType, Spec};

/// The tensors, then the scalars (a scalar keeps its default only when
/// every scalar after it has one too, as Python requires).
fn params(args: &Args) -> (Vec<&Field>, Vec<(&Field, Option<String>)>) {
    let tensors = args
        .fields
        .iter()
        .filter(|f| f.tensor().is_some())
        .collect();
    let scalars: Vec<&Field> = args
        .safe_fields()
        .filter(|f| f.scalar().is_some())
        .collect();
    let mut out: Vec<(&Field, Option<String>)> = Vec::new();
    let mut defaults_ok = true;
    for f in scalars.iter().rev() {
        let default = f.scalar().and_then(|s| s.default.clone());
        defaults_ok &= default.is_some();
        out.push((f, if defaults_ok { default } else { None }));
    }
    out.reverse();
    (tensors, out)
}

/// The Python (NumPy and PyTorch) names of spec dtypes.
fn python_dtypes(dtypes: &[String]) -> Vec<&'static str> {
    dtypes
        .iter()
        .map(|d| match d.as_str() {
            "f32" => "float32",
            "f16" => "float16",
            "bf16" => "bfloat16",
            "f64" => "float64",
            "i32" => "int32",
            "i64" => "int64",
            "u8" => "uint8",
            "bool" => "bool",
            other => panic!("dtype {other} has no Python name"),
        })
        .collect()
}

fn py_default(ty: ScalarType, rust: &str) -> String {
    match (ty, rust) {
        (ScalarType::Flag, "true") => "True".to_owned(),
        (ScalarType::Flag, _) => "False".to_owned(),
        _ => rust.to_owned(),
    }
}

pub(super) fn rust(spec: &Spec) -> String {
    let mut out = String::new();
    banner(
        &mut out,
        "`polychip.ops`: one function per operator, over `polychip_op_<name>`,\n\
         //! with the GIL released during the call.",
    );
    out.push_str(
        "\n#![allow(clippy::too_many_arguments)]\n\n\
         use polychip::*;\n\
         use pyo3::prelude::*;\n\n\
         use crate::errors::{Int, check, handle};\n\
         use crate::stream::Stream;\n\
         use crate::tensor::Tensor;\n",
    );
    for op in &spec.ops {
        function(&mut out, &spec.args[op.args], op);
    }
    out.push_str("\n/// Adds every operator to `m`, and `DTYPES`: operator name to the dtypes\n/// its `T` tensors may have.\npub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {\n");
    for op in &spec.ops {
        writeln!(
            out,
            "    m.add_function(wrap_pyfunction!({}, m)?)?;",
            op.name
        )
        .unwrap();
    }
    out.push_str("    let dtypes = pyo3::types::PyDict::new(m.py());\n");
    for op in &spec.ops {
        writeln!(
            out,
            "    dtypes.set_item(\"{}\", ({},))?;",
            op.name,
            python_dtypes(&op.dtypes)
                .iter()
                .map(|d| format!("\"{d}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
        .unwrap();
    }
    out.push_str("    m.add(\"DTYPES\", dtypes)?;\n    Ok(())\n}\n");
    out
}

fn function(out: &mut String, args: &Args, op: &Op) {
    let (tensors, scalars) = params(args);
    let mut signature: Vec<String> = tensors.iter().map(|f| f.name.clone()).collect();
    let mut rust_params: Vec<String> = tensors
        .iter()
        .map(|f| {
            let optional = f.tensor().is_some_and(|t| t.optional.is_some());
            format!(
                "{}: {}",
                f.name,
                if optional {
                    "Option<&Tensor>"
                } else {
                    "&Tensor"
                }
            )
        })
        .collect();
    for (f, default) in &scalars {
        let ty = f.scalar().expect("scalar").ty;
        let int = matches!(ty, ScalarType::I64 | ScalarType::I32);
        signature.push(match default {
            Some(d) if int => format!("{} = Int({d})", f.name),
            Some(d) => format!("{} = {d}", f.name),
            None => f.name.clone(),
        });
        // Integers through `Int`: out of range, the argument is named.
        rust_params.push(if int {
            format!("{}: Int<{}>", f.name, ty.safe())
        } else {
            format!("{}: {}", f.name, ty.safe())
        });
    }
    signature.push("*".to_owned());
    signature.push("stream = None".to_owned());
    rust_params.push("stream: Option<&Stream>".to_owned());
    writeln!(
        out,
        "\n/// `{}`: {}\n#[pyfunction]\n#[pyo3(signature = ({}))]\nfn {0}(py: Python<'_>, {}) -> PyResult<()> {{",
        op.name,
        op_comment(op),
        signature.join(", "),
        rust_params.join(", ")
    )
    .unwrap();
    for f in &tensors {
        if f.tensor().is_some_and(|t| t.optional.is_some()) {
            writeln!(out, "    let {0} = {0}.map_or(0, |t| t.handle);", f.name).unwrap();
        } else {
            writeln!(out, "    let {0} = {0}.handle;", f.name).unwrap();
        }
    }
    out.push_str("    let stream = stream.map_or(0, |s| s.handle);\n");
    let mut call = vec!["stream as *const _".to_owned()];
    call.extend(tensors.iter().map(|f| format!("{} as *const _", f.name)));
    call.extend(
        scalars
            .iter()
            .map(|(f, _)| match f.scalar().expect("scalar").ty {
                ScalarType::I64 | ScalarType::I32 => format!("{}.0", f.name),
                _ => f.name.clone(),
            }),
    );
    writeln!(
        out,
        "    let error = py.detach(move || handle(polychip_op_{}({})));\n    check(py, error)\n}}",
        op.name,
        call.join(", ")
    )
    .unwrap();
}

pub(super) fn stub(spec: &Spec) -> String {
    let mut out = String::from(
        "# @generated by polychip-spec from spec/ops.toml: do not edit; run\n\
         # `cargo run -p polychip-spec` after changing the spec.\n\
         \"\"\"Every operator of the op table. Outputs are given (they are written in\n\
         place); scalars follow the operator's args struct in include/polychip.h.\n\
         `stream=None` runs on the device's default stream and returns when done.\n\
         Arguments are checked by the host: a wrong dtype or shape raises\n\
         `polychip.errors.DTypeMismatch` / `ShapeMismatch` naming the operator\n\
         and the argument.\"\"\"\n\n\
         from typing import Dict, Optional, Tuple\n\n\
         from . import Stream, Tensor\n\n\
         DTYPES: Dict[str, Tuple[str, ...]]\n\
         \"\"\"Operator name to the dtypes its `T` tensors may have.\"\"\"\n",
    );
    for op in &spec.ops {
        let args = &spec.args[op.args];
        let (tensors, scalars) = params(args);
        let mut sig: Vec<String> = tensors
            .iter()
            .map(|f| {
                if f.tensor().is_some_and(|t| t.optional.is_some()) {
                    format!("{}: Optional[Tensor]", f.name)
                } else {
                    format!("{}: Tensor", f.name)
                }
            })
            .collect();
        for (f, default) in &scalars {
            let ty = f.scalar().expect("scalar").ty;
            let py_ty = match ty {
                ScalarType::F64 => "float",
                ScalarType::I64 | ScalarType::I32 => "int",
                ScalarType::Flag => "bool",
            };
            sig.push(match default {
                Some(d) => format!("{}: {py_ty} = {}", f.name, py_default(ty, d)),
                None => format!("{}: {py_ty}", f.name),
            });
        }
        sig.push("*".to_owned());
        sig.push("stream: Optional[Stream] = None".to_owned());
        writeln!(
            out,
            "\ndef {}({}) -> None:\n    \"\"\"{} Arguments of `Polychip{}Args`.\"\"\"",
            op.name,
            sig.join(", "),
            op_comment(op).replace('\\', "\\\\"),
            args.name
        )
        .unwrap();
    }
    out
}
