//! Normalisation test support: f64 references of RMSNorm and LayerNorm
//! rows (forward statistics, analytic backward) and the error allowance of
//! an f32 lane reduction.

use super::eps;
use ferrite_kernels::DType;

/// Error allowance of an f32 reduction over `n` terms (16 lanes, pairwise).
pub fn red(n: usize) -> f64 {
    (n as f64 / 8.0 + 8.0) * eps(DType::F32)
}

/// Forward of one row: (y, [stat0, stat1]) for RMSNorm (inv_rms) or
/// LayerNorm (mean, rstd).
pub fn norm_row(x: &[f64], w: &[f64], b: Option<&[f64]>, eps_: f64) -> (Vec<f64>, [f64; 2]) {
    let h = x.len() as f64;
    match b {
        None => {
            let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / h + eps_).sqrt();
            (
                x.iter().zip(w).map(|(a, w)| a * inv * w).collect(),
                [inv, 0.0],
            )
        }
        Some(b) => {
            let mu = x.iter().sum::<f64>() / h;
            let rs = 1.0 / (x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / h + eps_).sqrt();
            let y = x
                .iter()
                .zip(w)
                .zip(b)
                .map(|((a, w), b)| (a - mu) * rs * w + b)
                .collect();
            (y, [mu, rs])
        }
    }
}

/// Analytic backward of one row: (dx, dw per row, |terms| scale of dx).
pub fn norm_row_grad(
    x: &[f64],
    w: &[f64],
    g: &[f64],
    layer: bool,
    eps_: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let h = x.len() as f64;
    let bias = vec![0.0; x.len()];
    let (_, st) = norm_row(x, w, layer.then_some(&bias[..]), eps_);
    let gy: Vec<f64> = g.iter().zip(w).map(|(a, b)| a * b).collect();
    if layer {
        let (mu, rs) = (st[0], st[1]);
        let xh: Vec<f64> = x.iter().map(|v| (v - mu) * rs).collect();
        let a = gy.iter().sum::<f64>() / h;
        let b = gy.iter().zip(&xh).map(|(p, q)| p * q).sum::<f64>() / h;
        let mag = gy.iter().map(|v| v.abs()).sum::<f64>() / h * rs * 4.0;
        let dx = gy
            .iter()
            .zip(&xh)
            .map(|(gy, xh)| rs * (gy - a - xh * b))
            .collect();
        let sc = gy
            .iter()
            .zip(&xh)
            .map(|(gy, xh)| rs * (gy.abs() + xh.abs() * mag) + mag)
            .collect();
        (dx, g.iter().zip(&xh).map(|(g, xh)| g * xh).collect(), sc)
    } else {
        let inv = st[0];
        let s = gy.iter().zip(x).map(|(p, q)| p * q).sum::<f64>() / h;
        let sa = gy.iter().zip(x).map(|(p, q)| (p * q).abs()).sum::<f64>() / h;
        let dx = gy
            .iter()
            .zip(x)
            .map(|(gy, x)| inv * gy - x * inv.powi(3) * s)
            .collect();
        let sc = gy
            .iter()
            .zip(x)
            .map(|(gy, x)| inv * gy.abs() + x.abs() * inv.powi(3) * sa)
            .collect();
        (dx, g.iter().zip(x).map(|(g, x)| g * x * inv).collect(), sc)
    }
}
