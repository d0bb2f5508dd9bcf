//! Exact GELU forward + backward (`unary(GeluErf)` then
//! `activation_backward(GeluErf)`) of an f32 [64, 3072] tensor: the
//! vectorized kernel against the scalar `libm::erfcf` form it replaced, both
//! through the same blocked, parallel driver in one run (alternating round
//! by round), and against
//! PyTorch's CPU kernel (`F.gelu(approximate="none")` and its backward) at
//! the same thread count when `.venv/bin/python` has torch.
//!
//! Run: `cargo bench -p ferrite-kernels --bench gelu_erf`.
//! `POLYCHIP_BENCH_ROUNDS` sets the rounds (default 21; medians are printed),
//! `POLYCHIP_BENCH_PYTHON` the interpreter (`-` skips PyTorch).

use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use ferrite_kernels::{ActivationOp, DType, UnaryOp, View, activation_backward, unary};

const SHAPE: [i64; 2] = [64, 3072];
const STRIDES: [i64; 2] = [3072, 1];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

fn view(v: &mut [f32]) -> View<'static> {
    View::new(v.as_mut_ptr().cast(), DType::F32, &SHAPE, &STRIDES)
}

/// Buffers of one forward + backward: input, output, grad_out, grad_in.
struct Buffers {
    x: Vec<f32>,
    y: Vec<f32>,
    g: Vec<f32>,
    dx: Vec<f32>,
}

type Step = fn(&mut Buffers);

impl Buffers {
    /// Views of input, output, grad_out and grad_in.
    fn views(&mut self) -> [View<'static>; 4] {
        [
            view(&mut self.x),
            view(&mut self.y),
            view(&mut self.g),
            view(&mut self.dx),
        ]
    }
}

fn vectorized(b: &mut Buffers) {
    let [x, y, g, dx] = b.views();
    // SAFETY: four distinct live buffers of SHAPE's f32 elements.
    unsafe {
        unary(UnaryOp::GeluErf, &x, &y).unwrap();
        activation_backward(ActivationOp::GeluErf, &g, &x, &dx).unwrap();
    }
}

fn scalar_erfcf(b: &mut Buffers) {
    use ferrite_kernels::erfcf_reference as old;
    let [x, y, g, dx] = b.views();
    // SAFETY: as above.
    unsafe {
        old::unary_gelu_erf(&x, &y).unwrap();
        old::gelu_erf_backward(&g, &x, &dx).unwrap();
    }
}

/// Median seconds of `rounds` forward + backward steps of each of `steps`
/// (after one warm-up each), the steps alternating round by round so that a
/// change in the machine's load hits them alike.
fn time<const N: usize>(rounds: usize, b: &mut Buffers, steps: [Step; N]) -> [f64; N] {
    let mut samples = [(); N].map(|_| Vec::with_capacity(rounds));
    for step in steps {
        step(b);
    }
    for _ in 0..rounds {
        for (step, s) in steps.iter().zip(&mut samples) {
            let t = Instant::now();
            step(black_box(&mut *b));
            s.push(t.elapsed().as_secs_f64());
        }
    }
    samples.map(median)
}

const TORCH: &str = r#"
import statistics, sys, time, torch
threads, rounds = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
x = (torch.rand(64, 3072, generator=g) * 8 - 4).requires_grad_()
go = torch.rand(64, 3072, generator=g) * 2 - 1
def step():
    y = torch.nn.functional.gelu(x, approximate="none")
    (dx,) = torch.autograd.grad(y, x, go)
    return dx
step()
ts = []
for _ in range(rounds):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
print(statistics.median(ts), torch.__version__)
"#;

/// PyTorch's median seconds and version, when an interpreter with torch is
/// found.
fn torch(threads: usize, rounds: usize) -> Option<(f64, String)> {
    let python = std::env::var("POLYCHIP_BENCH_PYTHON").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
        PathBuf::from,
    );
    if python.as_os_str() == "-" {
        return None;
    }
    let out = Command::new(&python)
        .args(["-c", TORCH, &threads.to_string(), &rounds.to_string()])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "{}: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let secs = words.next()?.parse().ok()?;
    Some((secs, words.next().unwrap_or("?").to_string()))
}

fn main() {
    let rounds = std::env::var("POLYCHIP_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(21);
    let n = (SHAPE[0] * SHAPE[1]) as usize;
    let mut b = Buffers {
        x: values(n, 1, 4.0),
        y: vec![0.0; n],
        g: values(n, 2, 1.0),
        dx: vec![0.0; n],
    };
    let threads = rayon::current_num_threads();
    let [new, old] = time(rounds, &mut b, [vectorized, scalar_erfcf]);
    let ms = |s: f64| s * 1e3;
    println!("gelu_erf forward + backward, f32 {SHAPE:?}, {threads} threads, median of {rounds}:");
    println!(
        "  ferrite vectorized   {:8.3} ms  ({:.2} ns/element)",
        ms(new),
        new * 1e9 / n as f64
    );
    println!(
        "  ferrite scalar erfcf {:8.3} ms  ({:.2} ns/element)  {:.1}x the vectorized time",
        ms(old),
        old * 1e9 / n as f64,
        old / new
    );
    match torch(threads, rounds) {
        Some((t, version)) => println!(
            "  pytorch {version} cpu {:8.3} ms  ({:.2} ns/element)  {:.1}x the vectorized time",
            ms(t),
            t * 1e9 / n as f64,
            t / new
        ),
        None => println!("  pytorch: not measured (no interpreter with torch)"),
    }
}
