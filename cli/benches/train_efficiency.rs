//! Mixed-training efficiency, the papers' headline figure, measured on the
//! bundled plugins: the throughput of each chip type alone (HeteroAuto's
//! best plan for it, on one core), and of the mixed cluster (one core per
//! device) under HeteroAuto's pipeline-only plan (PP across two types),
//! data-parallel-only plan (DP across two types; again with the optimizer
//! step unsharded, `--no-shard-optimizer`, for the A/B) and best plan; efficiency
//! = mixed tokens/s over the sum of the alone tokens/s. With the OpenCL
//! plugin built beside the binary and an OpenCL device present (PoCL
//! here), also OpenCL alone and PP and DP across the three vendors (three
//! devices on two cores: see the note the bench prints). Also how far each
//! measured step time is from the planner's prediction.
//!
//! Needs `cargo build --release --workspace` first (the plugins next to the
//! binary). Settings: `ROUNDS` (default 5, configurations interleaved per
//! round, the two cores swapped every other round), `STEPS` (default 10 steps per run, the first excluded from the
//! median), `MODEL` (default `deep`, 16 blocks), `GLOBAL_BATCH` (64),
//! `ONLY` (comma-separated parts of configuration names to run, e.g.
//! `PP,alone`), `HOG=1` (each configuration also runs beside a CPU hog: a
//! busy process free to run on either core, in the same round; the table
//! then gives each configuration's throughput with the hog, the share of
//! its quiet throughput it keeps, and the share the hog leaves it, cores
//! over runnable processes).
//! `cargo bench -p polychip --bench train_efficiency`.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Config {
    name: &'static str,
    plan: &'static str,
    devices: &'static str,
    cores: &'static str,
    extra: &'static [&'static str],
    /// The configurations (indices) whose throughputs this one's
    /// efficiency is over: empty for a chip type alone.
    alone: &'static [usize],
    /// Needs the OpenCL plugin (loaded through POLYCHIP_PLUGIN_PATH).
    opencl: bool,
}

const TWO: &[usize] = &[0, 1];
const THREE: &[usize] = &[0, 1, 6];

const CONFIGS: [Config; 9] = [
    Config {
        name: "ferrite alone",
        plan: "auto",
        devices: "ferrite:0",
        cores: "0",
        extra: &[],
        alone: &[],
        opencl: false,
    },
    Config {
        name: "cobalt alone",
        plan: "auto",
        devices: "cobalt:0",
        cores: "1",
        extra: &[],
        alone: &[],
        opencl: false,
    },
    Config {
        name: "PP ferrite+cobalt",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &[],
        alone: TWO,
        opencl: false,
    },
    Config {
        name: "DP ferrite+cobalt",
        plan: "auto-dp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &[],
        alone: TWO,
        opencl: false,
    },
    // The same without the sharded optimizer step: each replica steps
    // every parameter, the slow chip's step exposed (the A/B of the shard).
    Config {
        name: "DP unsharded ferrite+cobalt",
        plan: "auto-dp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--no-shard-optimizer"],
        alone: TWO,
        opencl: false,
    },
    Config {
        name: "best ferrite+cobalt",
        plan: "auto",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &[],
        alone: TWO,
        opencl: false,
    },
    // Three vendors, with the OpenCL plugin (PoCL on this machine's CPU)
    // when it is built and finds a device. Three devices share two cores
    // here: the job's third rank shares core 0 with its first
    // (`pin::share`), so the efficiency is over three devices that each
    // had a core of their own when alone.
    Config {
        name: "opencl alone",
        plan: "auto",
        devices: "opencl:0",
        cores: "0",
        extra: &[],
        alone: &[],
        opencl: true,
    },
    Config {
        name: "PP 3 vendors (2 cores)",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0,opencl:0",
        cores: "0,1",
        extra: &[],
        alone: THREE,
        opencl: true,
    },
    Config {
        name: "DP 3 vendors (2 cores)",
        plan: "auto-dp",
        devices: "ferrite:0,cobalt:0,opencl:0",
        cores: "0,1",
        extra: &[],
        alone: THREE,
        opencl: true,
    },
];

/// The OpenCL plugin beside the binary, when it reports a device.
fn opencl_plugin(exe: &Path) -> Option<PathBuf> {
    let lib = exe.with_file_name("libpolychip_opencl.so");
    if !lib.is_file() {
        return None;
    }
    let out = Command::new(exe)
        .args(["devices", "--json"])
        .env("POLYCHIP_PLUGIN_PATH", &lib)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .to_lowercase()
        .contains("\"opencl")
        .then_some(lib)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// A CPU-bound process beside the job (killed on drop).
struct Hog(std::process::Child);

impl Hog {
    fn start() -> Hog {
        Hog(Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("start a CPU hog"))
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs one configuration; returns (tokens/s, measured step s, predicted step s, plan).
#[allow(clippy::too_many_arguments)]
fn run(
    exe: &Path,
    opencl: Option<&Path>,
    c: &Config,
    cores: &str,
    dir: &Path,
    model: &str,
    gb: usize,
    steps: u64,
) -> (f64, f64, f64, String) {
    let json = dir.join(format!(
        "{}.json",
        c.name.replace([' ', '+', '(', ')'], "-")
    ));
    let mut cmd = Command::new(exe);
    if let (true, Some(lib)) = (c.opencl, opencl) {
        cmd.env("POLYCHIP_PLUGIN_PATH", lib);
    }
    let out = cmd
        .args([
            "train",
            "--model",
            model,
            "--log-every",
            "0",
            "--eval-every",
            "0",
        ])
        .args([
            "--global-batch",
            &gb.to_string(),
            "--steps",
            &steps.to_string(),
        ])
        .args(["--plan", c.plan, "--devices", c.devices, "--cores", cores])
        .args(c.extra)
        .arg("--log-json")
        .arg(&json)
        .env("POLYCHIP_TRANSPORT", "shm")
        .output()
        .expect("run polychip train");
    assert!(
        out.status.success(),
        "{}: {}{}",
        c.name,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let s = &v["summary"];
    let describe = v["plan"]["group"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .map(|g| {
                    let stages: Vec<String> = g["stages"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|st| {
                            format!(
                                "{} {}..{}",
                                st["device"].as_str().unwrap(),
                                st["layers"][0],
                                st["layers"][1]
                            )
                        })
                        .collect();
                    format!(
                        "{}x[{}] b={} m={}",
                        g["copies"],
                        stages.join("|"),
                        g["micro_batch_size"],
                        g["micro_batches"]
                    )
                })
                .collect::<Vec<_>>()
                .join(" + ")
        })
        .unwrap_or_default();
    (
        s["tokens_per_s"].as_f64().unwrap(),
        s["median_step_seconds"].as_f64().unwrap(),
        v["plan"]["predicted_step_seconds"]
            .as_f64()
            .unwrap_or(f64::NAN),
        describe,
    )
}

fn main() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_polychip"));
    let rounds: usize = env_or("ROUNDS", 5);
    let steps: u64 = env_or("STEPS", 10);
    let gb: usize = env_or("GLOBAL_BATCH", 64);
    let model = std::env::var("MODEL").unwrap_or_else(|_| "deep".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        println!(
            "train_efficiency: needs 2 cores (one per device), this process may use {cores}; skipped"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("polychip-bench-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let only: Vec<String> = std::env::var("ONLY")
        .map(|v| v.split(',').map(|s| s.trim().to_lowercase()).collect())
        .unwrap_or_default();
    let opencl = opencl_plugin(&exe);
    let chosen = |c: &Config| {
        (!c.opencl || opencl.is_some())
            && (only.is_empty()
                || only
                    .iter()
                    .any(|o| c.name.to_lowercase().contains(o.as_str())))
    };
    let hog = std::env::var("HOG").is_ok_and(|v| v == "1");
    let mut results: Vec<Vec<(f64, f64, f64, String)>> = vec![Vec::new(); CONFIGS.len()];
    let mut hogged: Vec<Vec<(f64, f64, f64, String)>> = vec![Vec::new(); CONFIGS.len()];
    for round in 0..rounds {
        for (i, c) in CONFIGS.iter().enumerate() {
            if !chosen(c) {
                continue;
            }
            // The two cores are not quite alike: odd rounds swap them.
            let cores: String = match round % 2 {
                0 => c.cores.to_string(),
                _ => c
                    .cores
                    .chars()
                    .map(|ch| match ch {
                        '0' => '1',
                        '1' => '0',
                        other => other,
                    })
                    .collect(),
            };
            let r = run(&exe, opencl.as_deref(), c, &cores, &dir, &model, gb, steps);
            eprintln!(
                "round {}: {:<28} {:>9.0} tokens/s  {}",
                round + 1,
                c.name,
                r.0,
                r.3
            );
            results[i].push(r);
            if hog {
                let _h = Hog::start();
                let r = run(&exe, opencl.as_deref(), c, &cores, &dir, &model, gb, steps);
                eprintln!(
                    "round {}: {:<28} {:>9.0} tokens/s beside a CPU hog",
                    round + 1,
                    c.name,
                    r.0
                );
                hogged[i].push(r);
            }
        }
    }
    let spread = |v: &[(f64, f64, f64, String)]| {
        let t: Vec<f64> = v.iter().map(|x| x.0).collect();
        (
            t.iter().copied().fold(f64::INFINITY, f64::min),
            t.iter().copied().fold(0.0, f64::max),
        )
    };
    let tps: Vec<f64> = results
        .iter()
        .map(|r| median(r.iter().map(|x| x.0).collect()))
        .collect();
    // The sum of the alone throughputs a configuration is measured against.
    let alone_sum = |c: &Config| c.alone.iter().map(|&j| tps[j]).sum::<f64>();
    println!(
        "# polychip train efficiency: model {model}, global batch {gb}, {steps} steps, medians of {rounds} rounds"
    );
    println!(
        "{:<28} {:>11} {:>10} {:>10} {:>9} {:>11}  plan",
        "configuration", "tokens/s", "step ms", "pred. ms", "pred.err", "efficiency"
    );
    for (i, c) in CONFIGS.iter().enumerate() {
        if results[i].is_empty() {
            continue;
        }
        let step = median(results[i].iter().map(|x| x.1).collect());
        let pred = median(results[i].iter().map(|x| x.2).collect());
        let eff = if c.alone.is_empty() {
            "-".into()
        } else {
            format!("{:.2}%", tps[i] / alone_sum(c) * 100.0)
        };
        println!(
            "{:<28} {:>11.0} {:>10.1} {:>10.1} {:>8.1}% {:>11}  {}",
            c.name,
            tps[i],
            step * 1e3,
            pred * 1e3,
            (step / pred - 1.0) * 100.0,
            eff,
            results[i].last().map_or("", |x| x.3.as_str())
        );
    }
    for set in [TWO, THREE] {
        if set.iter().all(|&j| !results[j].is_empty()) {
            let names: Vec<&str> = set.iter().map(|&j| CONFIGS[j].name).collect();
            let sum: f64 = set.iter().map(|&j| tps[j]).sum();
            println!(
                "sum of the alone throughputs ({}): {sum:.0} tokens/s",
                names.join(", ")
            );
        }
    }
    // Efficiency round by round (each round's mixed run over the same
    // round's alone runs), its spread, and how many rounds the median
    // needs to be stable to a percentage point: the standard error of a
    // median is about 1.25 sigma / sqrt(n).
    {
        for (i, c) in CONFIGS.iter().enumerate() {
            let rounds = results[i].len();
            if c.alone.is_empty()
                || rounds == 0
                || c.alone.iter().any(|&j| results[j].len() != rounds)
            {
                continue;
            }
            let effs: Vec<f64> = (0..rounds)
                .map(|r| {
                    let sum: f64 = c.alone.iter().map(|&j| results[j][r].0).sum();
                    100.0 * results[i][r].0 / sum
                })
                .collect();
            let n = effs.len() as f64;
            let mean = effs.iter().sum::<f64>() / n;
            let sigma =
                (effs.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
            let need = (1.25 * sigma).powi(2).ceil().max(1.0);
            println!(
                "{:<28} efficiency by round: median {:.2}%, min {:.2}%, max {:.2}%, sigma {:.2} points: \
                 about {need:.0} rounds for a median stable to 1 point",
                c.name,
                median(effs.clone()),
                effs.iter().copied().fold(f64::INFINITY, f64::min),
                effs.iter().copied().fold(0.0, f64::max),
                sigma
            );
        }
    }
    println!(
        "{:<28} {:>19} {:>11} {:>19} {:>9} {:>10}",
        "spread and load", "quiet min-max", "with hog", "hog min-max", "kept", "hog leaves"
    );
    for (i, c) in CONFIGS.iter().enumerate() {
        if results[i].is_empty() {
            continue;
        }
        let (lo, hi) = spread(&results[i]);
        let (with, kept, leaves, hlo, hhi) = if hogged[i].is_empty() {
            (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN)
        } else {
            let t = median(hogged[i].iter().map(|x| x.0).collect());
            // Ranks of the configuration plus the hog on `cores` cores.
            let ranks = c.devices.split(',').count() as f64;
            let leaves = (cores as f64 / (ranks + 1.0)).min(1.0);
            let (a, b) = spread(&hogged[i]);
            (t, t / tps[i], leaves, a, b)
        };
        if hogged[i].is_empty() {
            println!("{:<28} {:>9.0}-{:<9.0}", c.name, lo, hi);
            continue;
        }
        println!(
            "{:<28} {:>9.0}-{:<9.0} {:>11.0} {:>9.0}-{:<9.0} {:>8.1}% {:>9.1}%",
            c.name,
            lo,
            hi,
            with,
            hlo,
            hhi,
            kept * 100.0,
            leaves * 100.0
        );
    }
    if opencl.is_none() {
        println!(
            "three vendors: not measured (the OpenCL plugin is not built beside the binary, or \
             finds no OpenCL device)"
        );
    } else {
        println!(
            "three vendors: three devices on two cores (the third rank shares core 0 with the \
             first), against each alone on a core of its own"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
