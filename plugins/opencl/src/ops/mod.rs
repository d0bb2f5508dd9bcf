//! The operators, one module per family, each a thin layer that resolves
//! the operands ([`crate::call::Ctx`]) and launches the family's kernels
//! from `kernels/<family>.cl`.

pub mod attention;
pub mod data;
pub mod elementwise;
pub mod embedding;
pub mod indexing;
pub mod matmul;
pub mod norm;
pub mod optim;
pub mod reduce;
pub mod softmax;

use polychip_plugin_sdk::Result;

use crate::program::{Args, Flavor};

/// Sets a floating scalar argument in the program's compute type (`A` in
/// `common.cl`: double in the f64 program, float elsewhere).
pub fn scalar<'a, 'k>(args: &'a mut Args<'k>, flavor: Flavor, v: f64) -> Result<&'a mut Args<'k>> {
    if flavor == Flavor::F64 {
        args.value(v)
    } else {
        args.value(v as f32)
    }
}
