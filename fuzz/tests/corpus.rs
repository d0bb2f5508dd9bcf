//! Every fuzz target in `cargo test`, without cargo-fuzz: each replays the
//! corpus kept in `fuzz/corpus/<target>` (what the fuzzers found, and the
//! seeds), then runs for a short time on inputs mutated from it by a small
//! seeded mutator (`POLYCHIP_FUZZ_SECS` seconds per target, default 2; the
//! seed is printed, and `POLYCHIP_FUZZ_SEED` replays a run). A panic names
//! the target and the input's file or the mutation's seed and round. The
//! real fuzzing (coverage-guided, with sanitizers) is `scripts/fuzz`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// xorshift64*: enough to mutate with, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to eight edits of `input`: bit flips, interesting bytes and words,
/// insertions, deletions, duplicated runs, splices of another input.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'-', b'9'][rng.below(8)];
            }
            2 => {
                let word: u64 =
                    [0, u64::MAX, 1 << 63, u32::MAX as u64, 1 << 32, 4096][rng.below(6)];
                let n = [1, 2, 4, 8][rng.below(4)];
                let end = (at + n).min(v.len());
                v.splice(at..end, word.to_le_bytes()[..n].iter().copied());
            }
            3 => {
                let n = 1 + rng.below(16);
                v.splice(at..at, (0..n).map(|_| rng.next() as u8).collect::<Vec<_>>());
            }
            4 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                let n = 1 + rng.below((v.len() - i).min(64));
                v.drain(i..i + n);
            }
            5 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                let n = 1 + rng.below((v.len() - i).min(256));
                let run = v[i..i + n].to_vec();
                v.splice(i..i, run);
            }
            _ if !other.is_empty() => {
                let from = rng.below(other.len());
                let n = 1 + rng.below((other.len() - from).min(512));
                let end = (at + n).min(v.len());
                v.splice(at..end, other[from..from + n].iter().copied());
            }
            _ => v.push(rng.next() as u8),
        }
    }
    // Inputs stay small, as libFuzzer's default -max_len keeps them.
    v.truncate(64 << 10);
    v
}

fn exercise(target: &str) {
    let run = polychip_fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, run)| *run)
        .expect("a target of TARGETS");
    let inputs = corpus(target);
    assert!(!inputs.is_empty(), "fuzz/corpus/{target} is empty");
    for (path, bytes) in &inputs {
        let caught = std::panic::catch_unwind(|| run(bytes));
        assert!(caught.is_ok(), "{target}: panicked on {}", path.display());
    }
    let secs: f64 = std::env::var("POLYCHIP_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let seed = std::env::var("POLYCHIP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let mut rng = Rng(seed);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut rounds = 0u64;
    while Instant::now() < until {
        let a = &inputs[rng.below(inputs.len())].1;
        let b = &inputs[rng.below(inputs.len())].1;
        let input = mutate(&mut rng, a, b);
        let caught = std::panic::catch_unwind(|| run(&input));
        assert!(
            caught.is_ok(),
            "{target}: panicked on mutated input {rounds} of seed {seed} \
             (POLYCHIP_FUZZ_SEED={seed} replays it): {input:02x?}"
        );
        rounds += 1;
    }
    eprintln!(
        "{target}: {} corpus inputs, then {rounds} mutated inputs in {secs} s (seed {seed})",
        inputs.len()
    );
}

#[test]
fn frames() {
    exercise("frames");
}

#[test]
fn manifest() {
    exercise("manifest");
}

#[test]
fn op_args() {
    exercise("op_args");
}

#[test]
fn safetensors() {
    exercise("safetensors");
}

#[test]
fn specs() {
    exercise("specs");
}

#[test]
fn store_wire() {
    exercise("store_wire");
}
