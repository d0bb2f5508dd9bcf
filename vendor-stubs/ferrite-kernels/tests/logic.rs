//! The ABI 1.3 kernels on plain host buffers: select and masked_fill move
//! bits through broadcast and in place, the comparisons follow IEEE, convert
//! rounds once and saturates, arange converts `start + i * step`, and the
//! integer binary operators wrap.

use ferrite_kernels::{
    BinaryOp, CompareOp, DType, View, arange, binary, compare, convert, masked_fill, select,
};

fn view<T>(
    v: &mut [T],
    dtype: DType,
    shape: &'static [i64],
    strides: &'static [i64],
) -> View<'static> {
    View::new(v.as_mut_ptr().cast(), dtype, shape, strides)
}

#[test]
fn select_broadcasts_three_operands_and_moves_bits() {
    let mut cond = [1u8, 0, 1];
    let mut a = [f32::from_bits(0x7fa0_0000), -0.0, 5.0];
    let mut b = [7.0f32, 8.0];
    let mut out = [0.0f32; 6];
    // cond [3] against a [3] and b [2, 1]: out [2, 3].
    let (c, x, y, o) = (
        view(&mut cond, DType::Bool, &[3], &[1]),
        view(&mut a, DType::F32, &[3], &[1]),
        view(&mut b, DType::F32, &[2, 1], &[1, 1]),
        view(&mut out, DType::F32, &[2, 3], &[3, 1]),
    );
    // SAFETY: every view addresses its own live buffer.
    unsafe { select(&c, &x, &y, &o) }.unwrap();
    let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
    assert_eq!(
        bits,
        [
            0x7fa0_0000,
            7f32.to_bits(),
            5f32.to_bits(),
            0x7fa0_0000,
            8f32.to_bits(),
            5f32.to_bits()
        ]
    );
}

#[test]
fn masked_fill_in_place_converts_the_value_as_fill_does() {
    let mut x = [1i32, 2, 3, 4];
    let mut m = [1u8, 0];
    let (xv, mv) = (
        view(&mut x, DType::I32, &[2, 2], &[2, 1]),
        view(&mut m, DType::Bool, &[2], &[1]),
    );
    // SAFETY: live buffers; out is exactly input.
    unsafe { masked_fill(&xv, &mv, &xv, 3e10) }.unwrap();
    assert_eq!(x, [i32::MAX, 2, i32::MAX, 4]);
}

#[test]
fn comparisons_follow_ieee_and_compare_i64_exactly() {
    let mut a = [f64::NAN, -0.0, 1.0, f64::INFINITY];
    let mut b = [f64::NAN, 0.0, 2.0, f64::INFINITY];
    let mut out = [9u8; 4];
    for (op, want) in [
        (CompareOp::Eq, [0, 1, 0, 1]),
        (CompareOp::Ne, [1, 0, 1, 0]),
        (CompareOp::Lt, [0, 0, 1, 0]),
        (CompareOp::Ge, [0, 1, 0, 1]),
    ] {
        let (x, y, o) = (
            view(&mut a, DType::F64, &[4], &[1]),
            view(&mut b, DType::F64, &[4], &[1]),
            view(&mut out, DType::Bool, &[4], &[1]),
        );
        // SAFETY: live buffers.
        unsafe { compare(op, &x, &y, &o) }.unwrap();
        assert_eq!(out, want, "{op:?}");
    }
    let mut p = [(1i64 << 53) + 1];
    let mut q = [1i64 << 53];
    let mut r = [9u8];
    let (x, y, o) = (
        view(&mut p, DType::I64, &[1], &[1]),
        view(&mut q, DType::I64, &[1], &[1]),
        view(&mut r, DType::Bool, &[1], &[1]),
    );
    // SAFETY: live buffers.
    unsafe { compare(CompareOp::Gt, &x, &y, &o) }.unwrap();
    assert_eq!(r, [1]);
}

#[test]
fn convert_rounds_once_and_saturates() {
    // 2^60 + 2^36 + 1 to f32: above the tie, so up (through f64 it would
    // land on the tie and go to the even neighbour below).
    let mut s = [(1i64 << 60) + (1 << 36) + 1, -5, i64::MAX];
    let mut d = [0.0f32; 3];
    let (sv, dv) = (
        view(&mut s, DType::I64, &[3], &[1]),
        view(&mut d, DType::F32, &[3], &[1]),
    );
    // SAFETY: live buffers.
    unsafe { convert(&sv, &dv) }.unwrap();
    assert_eq!(d[0], 2f32.powi(60) + 2f32.powi(37));
    assert_eq!(d[1], -5.0);
    let mut f = [f32::NAN, -1.5, 1e10, -0.0];
    let mut u = [7u8; 4];
    let (fv, uv) = (
        view(&mut f, DType::F32, &[4], &[1]),
        view(&mut u, DType::U8, &[4], &[1]),
    );
    // SAFETY: live buffers.
    unsafe { convert(&fv, &uv) }.unwrap();
    assert_eq!(u, [0, 0, 255, 0]);
    let mut bo = [9u8; 4];
    let bv = view(&mut bo, DType::Bool, &[4], &[1]);
    // SAFETY: live buffers.
    unsafe { convert(&fv, &bv) }.unwrap();
    assert_eq!(bo, [1, 1, 1, 0]);
}

#[test]
fn arange_and_integer_binary() {
    let mut out = [0i32; 5];
    let o = view(&mut out, DType::I32, &[5], &[1]);
    // SAFETY: a live buffer.
    unsafe { arange(&o, -1.0, 0.75) }.unwrap();
    assert_eq!(out, [-1, 0, 0, 1, 2]);
    let mut a = [i32::MAX, 1];
    let mut b = [1i32];
    let mut r = [0i32; 2];
    let (x, y, z) = (
        view(&mut a, DType::I32, &[2], &[1]),
        view(&mut b, DType::I32, &[1], &[1]),
        view(&mut r, DType::I32, &[2], &[1]),
    );
    // SAFETY: live buffers.
    unsafe { binary(BinaryOp::Add, &x, &y, &z, 2.0) }.unwrap();
    assert_eq!(r, [i32::MIN + 1, 3]);
}
