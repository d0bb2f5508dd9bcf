//! The C header compiles under `-std=c11 -Wall -Wextra -Werror -pedantic`,
//! and every struct's size, alignment and field offsets seen from C equal
//! those seen from Rust.

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use polychip_plugin_sdk::abi::*;

/// Expands to (C source lines, Rust facts) for each struct and its fields.
macro_rules! layout {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {{
        let mut c = String::new();
        let mut rust = BTreeMap::new();
        $(
            c.push_str(&format!(
                "  printf(\"{0} size %zu\\n\", sizeof({0}));\n  printf(\"{0} align %zu\\n\", _Alignof({0}));\n",
                stringify!($ty)
            ));
            rust.insert(format!("{} size", stringify!($ty)), size_of::<$ty>());
            rust.insert(format!("{} align", stringify!($ty)), align_of::<$ty>());
            $(
                c.push_str(&format!(
                    "  printf(\"{0}.{1} %zu\\n\", offsetof({0}, {1}));\n",
                    stringify!($ty), stringify!($field)
                ));
                rust.insert(format!("{}.{}", stringify!($ty), stringify!($field)), offset_of!($ty, $field));
            )*
        )*
        (c, rust)
    }};
}

#[test]
fn c_and_rust_agree_on_every_layout() {
    let (c_lines, rust) = layout! {
        PolychipDataType { code, bits, lanes }
        PolychipDevice { device_type, device_id }
        PolychipTensor { data, device, ndim, dtype, shape, strides, byte_offset }
        PolychipDeviceProps { struct_size, name, memory_bytes, memory_flags, compute_units, peak_flops_f32, peak_flops_bf16, peak_flops_f16, memory_bandwidth, link_bandwidth }
        PolychipHostApi { struct_size, abi_major, abi_minor, context, log, log_level, error_new, error_destroy }
        PolychipPluginApi { struct_size, abi_major, abi_minor, vendor, plugin_version, device_count, device_props, mem_alloc, mem_free, stream_create, stream_destroy, stream_synchronize, event_create, event_destroy, event_record, stream_wait_event, event_synchronize, memcpy_h2d, memcpy_d2h, memcpy_d2d, ops }
        PolychipOpTable { struct_size, fill, copy, cast, add, sub, mul, div, matmul, softmax, neg, exp, log, sqrt, rsqrt, tanh, pow_scalar, relu, relu_backward, silu, silu_backward, gelu, gelu_backward, swiglu, swiglu_backward, sum, mean, max, argmax, sum_squares, linear, softmax_backward, log_softmax, log_softmax_backward, rms_norm, rms_norm_backward, layer_norm, layer_norm_backward, rope, rope_backward, attention, attention_backward, embedding, embedding_backward, cross_entropy, cross_entropy_backward, adamw, scale }
        PolychipFillArgs { struct_size, out, value }
        PolychipCopyArgs { struct_size, src, dst }
        PolychipCastArgs { struct_size, src, dst }
        PolychipBinaryArgs { struct_size, a, b, out, alpha }
        PolychipMatmulArgs { struct_size, a, b, out, alpha, beta, transpose_a, transpose_b }
        PolychipSoftmaxArgs { struct_size, input, out }
        PolychipUnaryArgs { struct_size, input, out }
        PolychipPowScalarArgs { struct_size, input, out, exponent }
        PolychipActivationBackwardArgs { struct_size, grad_out, input, grad_in }
        PolychipSwigluArgs { struct_size, gate, up, out }
        PolychipSwigluBackwardArgs { struct_size, gate, up, grad_out, grad_gate, grad_up }
        PolychipReduceArgs { struct_size, input, out, dim, keepdim }
        PolychipSumSquaresArgs { struct_size, input, out }
        PolychipSoftmaxBackwardArgs { struct_size, out, grad_out, grad_in }
        PolychipRmsNormArgs { struct_size, input, weight, out, inv_rms, eps }
        PolychipRmsNormBackwardArgs { struct_size, grad_out, input, weight, inv_rms, grad_input, grad_weight }
        PolychipLayerNormArgs { struct_size, input, weight, bias, out, mean, rstd, eps }
        PolychipLayerNormBackwardArgs { struct_size, grad_out, input, weight, mean, rstd, grad_input, grad_weight, grad_bias }
        PolychipRopeArgs { struct_size, input, cos, sin, out, interleaved }
        PolychipAttentionArgs { struct_size, q, k, v, out, lse, scale, causal }
        PolychipAttentionBackwardArgs { struct_size, q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, scale, causal }
        PolychipLinearArgs { struct_size, input, weight, bias, out, has_bias }
        PolychipEmbeddingArgs { struct_size, weight, indices, out }
        PolychipEmbeddingBackwardArgs { struct_size, grad_out, indices, grad_weight }
        PolychipCrossEntropyArgs { struct_size, logits, targets, loss, ignore_index }
        PolychipCrossEntropyBackwardArgs { struct_size, logits, targets, grad_logits, grad_loss, ignore_index }
        PolychipAdamwArgs { struct_size, param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step }
        PolychipScaleArgs { struct_size, tensor, alpha }
    };
    let constants = [
        ("POLYCHIP_ABI_MAJOR", POLYCHIP_ABI_MAJOR as usize),
        ("POLYCHIP_ABI_MINOR", POLYCHIP_ABI_MINOR as usize),
        ("POLYCHIP_ABI_MIN_MINOR", POLYCHIP_ABI_MIN_MINOR as usize),
        ("POLYCHIP_ERROR_PANIC", POLYCHIP_ERROR_PANIC as usize),
        (
            "POLYCHIP_DEVICE_TYPE_EXT",
            POLYCHIP_DEVICE_TYPE_EXT as usize,
        ),
    ];
    let mut rust = rust;
    let mut c_consts = String::new();
    for (name, value) in constants {
        c_consts.push_str(&format!("  printf(\"{name} %zu\\n\", (size_t){name});\n"));
        rust.insert(name.to_string(), value);
    }

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c_layout");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n#include \"polychip.h\"\n\n\
             /* The entry symbol's declaration must match its typedef. */\n\
             static PolychipPluginInitV1 entry_type_check = polychip_plugin_init_v1;\n\n\
             int main(void) {{\n  (void)entry_type_check;\n{c_lines}{c_consts}  return 0;\n}}\n"
        ),
    )
    .unwrap();
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include");
    let exe = dir.join("layout");
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .opt_level(0)
        .target(env!("TARGET_TRIPLE"))
        .host(env!("TARGET_TRIPLE"))
        .get_compiler();
    // The header only declares the entry symbol; a stub defines it so the
    // program links (and its definition is checked against the declaration).
    let stub = dir.join("stub.c");
    std::fs::write(
        &stub,
        "#include \"polychip.h\"\nPolychipError *polychip_plugin_init_v1(const PolychipHostApi *host,\n    const PolychipPluginApi **out_plugin) { (void)host; (void)out_plugin; return NULL; }\n",
    )
    .unwrap();
    let output = compiler
        .to_command()
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(&include)
        .arg(&source)
        .arg(&stub)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C compiler");
    assert!(
        output.status.success(),
        "include/polychip.h does not compile as strict C11:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(run.status.success());
    let mut c = BTreeMap::new();
    for line in String::from_utf8(run.stdout).unwrap().lines() {
        let (key, value) = line.rsplit_once(' ').unwrap();
        c.insert(key.to_string(), value.parse::<usize>().unwrap());
    }
    let mut mismatches = Vec::new();
    for (key, rust_value) in &rust {
        match c.get(key) {
            Some(c_value) if c_value == rust_value => {}
            other => mismatches.push(format!("{key}: Rust {rust_value}, C {other:?}")),
        }
    }
    assert!(
        mismatches.is_empty(),
        "layouts differ:\n{}",
        mismatches.join("\n")
    );
    assert_eq!(c.len(), rust.len());
}
