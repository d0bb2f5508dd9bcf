//! Every v1 operator on both bundled plugins (Ferrite in Rust, Cobalt in C),
//! through the host, against values computed here in f64. The full
//! conformance suite goes further; these tests pin the semantics.

mod common;

use half::{bf16, f16};
use polychip_host::{DType, Device, ErrorCode, HostError, MatmulOptions, Tensor};

/// An operator and the f64 formula it must match.
type Case = (polychip_host::BinaryOp, fn(f64, f64) -> f64);

fn devices() -> Vec<Device> {
    vec![
        common::first_device(&common::ferrite_path()),
        common::first_device(&common::cobalt_path()),
    ]
}

/// Reads any floating tensor as f64.
fn to_f64(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        other => panic!("not a float dtype: {other}"),
    }
}

/// A tensor of dtype `dtype` holding `values` rounded to it.
fn from_f64(device: &Device, dtype: DType, values: &[f64], shape: &[i64]) -> Tensor {
    match dtype {
        DType::F32 => {
            device.from_slice(&values.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape)
        }
        DType::F64 => device.from_slice(values, shape),
        DType::F16 => device.from_slice(
            &values.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(),
            shape,
        ),
        DType::BF16 => device.from_slice(
            &values
                .iter()
                .map(|&v| bf16::from_f64(v))
                .collect::<Vec<_>>(),
            shape,
        ),
        other => panic!("not a float dtype: {other}"),
    }
    .unwrap()
}

fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON / 2.0,
        DType::F32 => f32::EPSILON as f64 / 2.0,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        other => panic!("{other}"),
    }
}

fn assert_close(what: &str, dtype: DType, got: &[f64], want: &[f64], terms: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = 4.0 * unit_roundoff(dtype) * terms as f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * w.abs().max(1.0) || (g.is_nan() && w.is_nan());
        assert!(
            ok,
            "{what} ({dtype}): element {i} is {g}, expected {w} (tolerance {tol})"
        );
    }
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

#[test]
fn fill_converts_the_value_for_every_dtype() {
    for device in devices() {
        let exec = device.exec();
        for dtype in DType::ALL {
            let t = device.zeros(dtype, &[2, 3]).unwrap();
            exec.fill(&t, -3.75).unwrap();
            let bytes = t.read_bytes().unwrap();
            let first = &bytes[..dtype.size()];
            let expected: Vec<u8> = match dtype {
                DType::F32 => (-3.75f32).to_ne_bytes().to_vec(),
                DType::F64 => (-3.75f64).to_ne_bytes().to_vec(),
                DType::F16 => f16::from_f64(-3.75).to_ne_bytes().to_vec(),
                DType::BF16 => bf16::from_f64(-3.75).to_ne_bytes().to_vec(),
                DType::I32 => (-3i32).to_ne_bytes().to_vec(),
                DType::I64 => (-3i64).to_ne_bytes().to_vec(),
                DType::U8 => vec![(-3.75f64) as u8],
                DType::Bool => vec![1],
            };
            assert_eq!(first, expected.as_slice(), "{device}: fill {dtype}");
            assert!(
                bytes.chunks(dtype.size()).all(|c| c == first),
                "{device}: fill {dtype} wrote every element"
            );
        }
    }
}

#[test]
fn copy_transposes_and_handles_every_dtype() {
    for device in devices() {
        for dtype in [DType::F32, DType::BF16, DType::F64, DType::I64, DType::U8] {
            let n = 12;
            let bytes: Vec<u8> = (0..n * dtype.size()).map(|i| (i * 7 % 251) as u8).collect();
            let src = device.empty(dtype, &[3, 4]).unwrap();
            src.write_bytes(&bytes).unwrap();
            let transposed = src.transpose(0, 1).unwrap();
            let dst = device.empty(dtype, &[4, 3]).unwrap();
            device.exec().copy(&transposed, &dst).unwrap();
            assert_eq!(
                dst.read_bytes().unwrap(),
                transposed.read_bytes().unwrap(),
                "{device}: copy {dtype}"
            );
        }
    }
}

#[test]
fn cast_rounds_to_nearest_even_including_from_f64() {
    for device in devices() {
        let exec = device.exec();
        // f32 -> bf16: a tie rounds to even, just above a tie rounds up, NaN stays NaN.
        let src_bits = [0x3F80_8000u32, 0x3F81_8000, 0x3F80_8001, 0x7FC0_0000];
        let src = device
            .from_slice(&src_bits.map(f32::from_bits), &[4])
            .unwrap();
        let dst = device.empty(DType::BF16, &[4]).unwrap();
        exec.cast(&src, &dst).unwrap();
        let got: Vec<u16> = dst
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|b| b.to_bits())
            .collect();
        assert_eq!(
            &got[..3],
            &[0x3F80, 0x3F82, 0x3F81],
            "{device}: f32 -> bf16"
        );
        assert!(bf16::from_bits(got[3]).is_nan(), "{device}: NaN survives");
        // f64 -> f16 directly: 1 + 2^-11 + 2^-40 is just above a tie in f16,
        // so it rounds up; rounding through f32 first would lose 2^-40 and
        // round the resulting tie down to 1.0.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        let src = device.from_slice(&[x, 70000.0], &[2]).unwrap();
        let dst = device.empty(DType::F16, &[2]).unwrap();
        exec.cast(&src, &dst).unwrap();
        let got = dst.to_vec::<f16>().unwrap();
        assert_eq!(
            got[0].to_f64(),
            1.0 + 2f64.powi(-10),
            "{device}: f64 -> f16 without double rounding"
        );
        assert!(got[1].is_infinite(), "{device}: overflow gives inf");
    }
}

#[test]
fn binary_ops_broadcast_in_every_float_dtype() {
    for device in devices() {
        for dtype in DType::FLOATS {
            let a_vals = values(6, 1);
            let b_vals = values(3, 2);
            let a = from_f64(&device, dtype, &a_vals, &[2, 3]);
            let b = from_f64(&device, dtype, &b_vals, &[3]);
            let (a_r, b_r) = (to_f64(&a), to_f64(&b));
            let out = device.empty(dtype, &[2, 3]).unwrap();
            let cases: [Case; 4] = [
                (polychip_host::BinaryOp::Add, |x, y| x + 0.5 * y),
                (polychip_host::BinaryOp::Sub, |x, y| x - 0.5 * y),
                (polychip_host::BinaryOp::Mul, |x, y| x * y),
                (polychip_host::BinaryOp::Div, |x, y| x / y),
            ];
            for (op, f) in cases {
                device.exec().binary(op, &a, &b, &out, 0.5).unwrap();
                let want: Vec<f64> = (0..6).map(|i| f(a_r[i], b_r[i % 3])).collect();
                assert_close(
                    &format!("{device} {}", op.name()),
                    dtype,
                    &to_f64(&out),
                    &want,
                    2,
                );
            }
        }
    }
}

#[test]
fn binary_in_place_and_strided() {
    for device in devices() {
        let a = device
            .from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
            .unwrap();
        let b = device
            .from_slice(&[10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0], &[3, 2])
            .unwrap();
        let bt = b.transpose(0, 1).unwrap();
        device.exec().add(&a, &bt, &a, 1.0).unwrap();
        assert_eq!(
            a.to_vec::<f32>().unwrap(),
            [11.0, 32.0, 53.0, 24.0, 45.0, 66.0],
            "{device}"
        );
    }
}

fn matmul_reference(
    a: &[f64],
    b: &[f64],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| {
                    let x = if ta { a[p * m + i] } else { a[i * k + p] };
                    let y = if tb { b[j * k + p] } else { b[p * n + j] };
                    x * y
                })
                .sum();
        }
    }
    out
}

#[test]
fn matmul_with_transposes_batches_alpha_and_beta() {
    let (m, k, n) = (3usize, 5usize, 4usize);
    for device in devices() {
        for dtype in DType::FLOATS {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a_vals = values(2 * m * k, 3);
                let b_vals = values(k * n, 4);
                let a_shape: [i64; 3] = if ta {
                    [2, k as i64, m as i64]
                } else {
                    [2, m as i64, k as i64]
                };
                let b_shape: [i64; 2] = if tb {
                    [n as i64, k as i64]
                } else {
                    [k as i64, n as i64]
                };
                let a = from_f64(&device, dtype, &a_vals, &a_shape);
                let b = from_f64(&device, dtype, &b_vals, &b_shape);
                let out = from_f64(
                    &device,
                    dtype,
                    &vec![1.0; 2 * m * n],
                    &[2, m as i64, n as i64],
                );
                let options = MatmulOptions {
                    transpose_a: ta,
                    transpose_b: tb,
                    alpha: 2.0,
                    beta: 0.5,
                };
                device.exec().matmul(&a, &b, &out, options).unwrap();
                let (a_r, b_r) = (to_f64(&a), to_f64(&b));
                let mut want = Vec::new();
                for batch in 0..2 {
                    let prod = matmul_reference(
                        &a_r[batch * m * k..(batch + 1) * m * k],
                        &b_r,
                        m,
                        k,
                        n,
                        ta,
                        tb,
                    );
                    want.extend(prod.iter().map(|p| 2.0 * p + 0.5));
                }
                assert_close(
                    &format!("{device} matmul ta={ta} tb={tb}"),
                    dtype,
                    &to_f64(&out),
                    &want,
                    k + 2,
                );
            }
        }
    }
}

#[test]
fn matmul_with_beta_zero_ignores_nan_in_out() {
    for device in devices() {
        let a = device
            .from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])
            .unwrap();
        let out = device.from_slice(&[f32::NAN; 4], &[2, 2]).unwrap();
        device
            .exec()
            .matmul(&a, &a, &out, MatmulOptions::default())
            .unwrap();
        assert_eq!(
            out.to_vec::<f32>().unwrap(),
            [7.0, 10.0, 15.0, 22.0],
            "{device}"
        );
    }
}

#[test]
fn softmax_subtracts_the_max_and_handles_every_float_dtype() {
    for device in devices() {
        for dtype in DType::FLOATS {
            let input = from_f64(
                &device,
                dtype,
                &[1000.0, 1001.0, 1002.0, -1.0, 0.0, 1.0],
                &[2, 3],
            );
            let out = device.empty(dtype, &[2, 3]).unwrap();
            device.exec().softmax(&input, &out).unwrap();
            let x = to_f64(&input);
            let mut want = Vec::new();
            for row in x.chunks(3) {
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
                want.extend(row.iter().map(|v| (v - max).exp() / sum));
            }
            assert_close(&format!("{device} softmax"), dtype, &to_f64(&out), &want, 4);
        }
    }
}

#[test]
fn bad_shapes_and_dtypes_are_refused_naming_the_op_and_shapes() {
    for device in devices() {
        let a = device.zeros(DType::F32, &[2, 3]).unwrap();
        let b = device.zeros(DType::F32, &[4]).unwrap();
        let error = device.exec().add(&a, &b, &a, 1.0).unwrap_err();
        assert_eq!(error.code(), ErrorCode::ShapeMismatch);
        assert!(
            error
                .to_string()
                .ends_with("add: b has shape [4], but it does not broadcast with a's shape [2, 3]"),
            "{error}"
        );
        let i = device.zeros(DType::I32, &[2, 3]).unwrap();
        let error = device.exec().softmax(&i, &i).unwrap_err();
        assert_eq!(error.code(), ErrorCode::DTypeMismatch);
        assert!(
            error.to_string().contains("softmax: input has dtype i32"),
            "{error}"
        );
        let error = device
            .exec()
            .matmul(&a, &a, &a, MatmulOptions::default())
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("inner dimension 2 differs from a's 3"),
            "{error}"
        );
    }
}

#[test]
fn an_allocation_over_capacity_is_out_of_memory_not_a_crash() {
    for device in devices() {
        let too_much = device.props().memory_bytes + 1;
        let error = device.alloc(too_much).unwrap_err();
        assert_eq!(error.code(), ErrorCode::OutOfMemory, "{device}: {error}");
        assert!(
            matches!(
                error,
                HostError::Plugin {
                    function: "mem_alloc",
                    ..
                }
            ),
            "{error:?}"
        );
        // The device keeps working.
        let t = device.from_slice(&[1.0f32], &[1]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [1.0]);
    }
}

#[test]
fn streams_and_events_order_work_across_streams() {
    for device in devices() {
        let s1 = device.stream().unwrap();
        let s2 = device.stream().unwrap();
        let a = device.zeros(DType::F32, &[256, 256]).unwrap();
        let b = device.zeros(DType::F32, &[256, 256]).unwrap();
        s1.exec().fill(&a, 1.0).unwrap();
        s1.exec()
            .matmul(&a, &a, &b, MatmulOptions::default())
            .unwrap();
        let done = s1.record().unwrap();
        s2.wait(&done).unwrap();
        let c = device.zeros(DType::F32, &[256, 256]).unwrap();
        s2.exec().add(&b, &b, &c, 1.0).unwrap();
        s2.synchronize().unwrap();
        assert!(
            c.to_vec::<f32>().unwrap().iter().all(|&v| v == 512.0),
            "{device}"
        );
        done.synchronize().unwrap();
        s1.synchronize().unwrap();
    }
}

/// Writing host bytes into a view that reaches one element through several
/// indices (a zero stride) is refused, as an operator's output of that view
/// is; it kept the last value silently. A strided view without overlap is
/// written element by element.
#[test]
fn writing_into_a_self_overlapping_view_is_refused() {
    for device in devices() {
        let base = device.from_slice(&[0.0f32; 4], &[4]).unwrap();
        let overlapping = base.as_strided(&[3], &[0], 0).unwrap();
        let bytes: Vec<u8> = [7.0f32, 8.0, 9.0]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        let err = overlapping.write_bytes(&bytes).unwrap_err().to_string();
        assert!(
            err.contains("cannot write 12 bytes into this view")
                && err.contains("writes some elements more than once"),
            "{err}"
        );
        assert_eq!(base.to_vec::<f32>().unwrap(), [0.0; 4]);
        let every_other = base.as_strided(&[2], &[2], 0).unwrap();
        every_other.write_bytes(&bytes[..8]).unwrap();
        assert_eq!(base.to_vec::<f32>().unwrap(), [7.0, 0.0, 8.0, 0.0]);
    }
}
