//! Mixed-training efficiency, the papers' headline figure, measured on the
//! bundled plugins: the throughput of each chip type alone (HeteroAuto's
//! best plan for it, on one core), and of the mixed cluster (one core per
//! device) under HeteroAuto's pipeline-only plan (PP across two types),
//! data-parallel-only plan (DP across two types; again with the optimizer
//! step unsharded, `--no-shard-optimizer`, and with the gradient reduction
//! after the backward pass, `--reduce-after-backward`, for the A/Bs; the
//! pipeline's plan again under 1F1B, `--schedule 1f1b` (the plan takes
//! whichever schedule the planner predicts faster), with no stage running
//! ahead of the schedule's own lead, `--run-ahead 1` (the plan runs ahead
//! where memory allows), and with blocking sends, `--blocking-sends`, too)
//! and best plan;
//! efficiency = mixed tokens/s over the sum of the alone tokens/s. With the
//! OpenCL plugin built beside the binary and an OpenCL device present (PoCL
//! here), also OpenCL alone and PP and DP across the three vendors (three
//! devices on two cores: see the note the bench prints). Also how far each
//! measured step time is from the planner's prediction.
//!
//! How it fights the noise of a shared machine (whose speed drifts by tens
//! of percent over minutes): every configuration is planned once, at the
//! start (the plans are printed), so a run measures its plan and not the
//! profile of the moment (each type alone at the micro-batch size that
//! measured fastest in short runs of 4, 2 and 1 sequences, so the
//! denominator is each type at its best, not at one noisy profile's
//! choice: such a choice once put Ferrite alone at micro-batches of 1, 25%
//! below its best, and the mixed runs at 127% of the sum); the fast type alone (Ferrite, about 95% of the
//! sum) is run right before each mixed run and each mixed run's efficiency
//! is over that run and the slow type alone of the same round, so the
//! ratio pairs runs seconds apart; the figures are medians over rounds with
//! their min, max and standard deviation, and the number of rounds a median
//! stable to a percentage point would need.
//!
//! How the types alone are measured (`ALONE`): `beside` (the default) runs
//! each alone while the other type trains on the other core (a
//! long-running `polychip train` of it, paused with SIGSTOP between uses),
//! as the other core works in a mixed run: a core may run slower while the
//! other computes (shared caches, memory bandwidth and clock budget, which
//! separate chips do not share), so an alone run on an idle machine may
//! measure a faster machine than the mixed run has (here, over 16 rounds,
//! less than the noise). `quiet` runs them with the
//! other core idle (the older figure); `both` measures both and prints the
//! efficiency over each.
//!
//! Needs `cargo build --release --workspace` first (the plugins next to the
//! binary). Settings: `ROUNDS` (default 5, the two cores swapped every
//! other round), `STEPS` (default 10 steps per run, the first excluded from
//! the median), `SLOW_STEPS` (default 4: steps of the slow type alone, whose
//! steps are long and steady), `SLOW_GLOBAL_BATCH` (default `GLOBAL_BATCH`:
//! the slow types alone at a smaller global batch, where a step of the
//! large one would take minutes; a device alone runs its micro-batches
//! back to back, so its tokens/s moves only by its optimizer step's share
//! of the step, under 0.5% for Cobalt at 64 sequences), `MODEL` (default
//! `deep`, 16 blocks),
//! `GLOBAL_BATCH` (64), `PROFILE_ERROR` (the planner's `--profile-error`,
//! its default when unset), `ONLY` (comma-separated parts of the mixed
//! configurations' names, e.g. `PP,DP`), `HOG=1` (each mixed configuration
//! also runs beside a CPU hog, a busy process free to run on either core,
//! or with `HOG=core:N` bound to core N, a load on one chip only;
//! the table then gives its throughput with the hog, the share of its quiet
//! throughput it keeps, and the share the hog leaves it: cores over
//! runnable processes, or for a bound hog the cores less its share of its
//! one core).
//! `cargo bench -p polychip --bench train_efficiency`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

struct Config {
    name: &'static str,
    plan: &'static str,
    devices: &'static str,
    cores: &'static str,
    extra: &'static [&'static str],
    /// The types alone (indices into [`ALONE`]) this one's efficiency is
    /// over: empty for a type alone.
    alone: &'static [usize],
    /// Needs the OpenCL plugin (loaded through POLYCHIP_PLUGIN_PATH).
    opencl: bool,
    /// Runs the plan of this other configuration (an A/B of a trainer
    /// setting on one layout), when that one runs too.
    same_plan_as: Option<&'static str>,
}

/// The types alone: Ferrite, Cobalt, OpenCL.
const FERRITE: usize = 0;
const COBALT: usize = 1;
const OPENCL: usize = 2;
const TWO: &[usize] = &[FERRITE, COBALT];
const THREE: &[usize] = &[FERRITE, COBALT, OPENCL];

const ALONE: [Config; 3] = [
    Config {
        name: "ferrite alone",
        plan: "auto",
        devices: "ferrite:0",
        cores: "0",
        extra: &[],
        alone: &[],
        opencl: false,
        same_plan_as: None,
    },
    Config {
        name: "cobalt alone",
        plan: "auto",
        devices: "cobalt:0",
        cores: "1",
        extra: &[],
        alone: &[],
        opencl: false,
        same_plan_as: None,
    },
    Config {
        name: "opencl alone",
        plan: "auto",
        devices: "opencl:0",
        cores: "0",
        extra: &[],
        alone: &[],
        opencl: true,
        same_plan_as: None,
    },
];

const MIXED: [Config; 12] = [
    Config {
        name: "PP ferrite+cobalt",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &[],
        alone: TWO,
        opencl: false,
        same_plan_as: None,
    },
    Config {
        name: "DP ferrite+cobalt",
        plan: "auto-dp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &[],
        alone: TWO,
        opencl: false,
        same_plan_as: None,
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
        same_plan_as: None,
    },
    // The same with the gradient reduction after the whole backward pass
    // (`--reduce-after-backward`): the A/B of overlapping it.
    Config {
        name: "DP reduce-after ferrite+cobalt",
        plan: "auto-dp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--reduce-after-backward"],
        alone: TWO,
        opencl: false,
        same_plan_as: Some("DP ferrite+cobalt"),
    },
    // The pipeline's plan under 1F1B (`--schedule 1f1b`): the A/B of the
    // schedule the plan above may have chosen instead, zero bubble or 1F1B
    // with deferred weights (then without a prediction: the plan was
    // priced under the other).
    Config {
        name: "PP 1f1b ferrite+cobalt",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--schedule", "1f1b"],
        alone: TWO,
        opencl: false,
        same_plan_as: Some("PP ferrite+cobalt"),
    },
    // The pipeline's plan with no stage running ahead of the schedule's
    // own lead (`--run-ahead 1`): the A/B of running ahead, which the plan
    // above has where memory allows (docs/performance.md, "Running ahead").
    Config {
        name: "PP run-ahead-1 ferrite+cobalt",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--run-ahead", "1"],
        alone: TWO,
        opencl: false,
        same_plan_as: Some("PP ferrite+cobalt"),
    },
    // The same with each send blocking its stage (`--blocking-sends`)
    // instead of queued for the rank's sender thread: the A/B of the
    // asynchronous sends (under 1F1B and no run-ahead, which every plan
    // can run with blocking sends; zero bubble cannot).
    Config {
        name: "PP blocking-sends ferrite+cobalt",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--blocking-sends", "--schedule", "1f1b", "--run-ahead", "1"],
        alone: TWO,
        opencl: false,
        same_plan_as: Some("PP ferrite+cobalt"),
    },
    // The pipeline's plan with its cuts moved every 2 steps by the
    // stages' measured speeds (`--rebalance-every 2`): the A/B of moving
    // them, telling most beside a hog bound to one core (`HOG=core:1`)
    // and over enough steps (`STEPS=12`) for a move to pay.
    Config {
        name: "PP rebalanced ferrite+cobalt",
        plan: "auto-pp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--rebalance-every", "2"],
        alone: TWO,
        opencl: false,
        same_plan_as: Some("PP ferrite+cobalt"),
    },
    // The same dealing the batch again every 2 steps by the replicas'
    // measured speeds (`--rebalance-every 2`): the A/B of rebalancing,
    // telling most beside a hog bound to one core (`HOG=core:1`).
    Config {
        name: "DP rebalanced ferrite+cobalt",
        plan: "auto-dp",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &["--rebalance-every", "2"],
        alone: TWO,
        opencl: false,
        same_plan_as: Some("DP ferrite+cobalt"),
    },
    Config {
        name: "best ferrite+cobalt",
        plan: "auto",
        devices: "ferrite:0,cobalt:0",
        cores: "0,1",
        extra: &[],
        alone: TWO,
        opencl: false,
        same_plan_as: None,
    },
    // Three vendors, with the OpenCL plugin (PoCL on this machine's CPU)
    // when it is built and finds a device. Three devices share two cores
    // here: `--plan` profiles and plans each way they can pair on the
    // cores (`--core-order auto`) and keeps the best, which so far has
    // always been Ferrite on a core of its own (beside OpenCL it ran 1.30x
    // slower; docs/performance.md, "Which devices share a core"). The
    // efficiency is over three devices that each had a core of their own
    // when alone (and is over the quiet alone runs).
    Config {
        name: "PP 3 vendors (2 cores)",
        plan: "auto-pp",
        devices: "cobalt:0,ferrite:0,opencl:0",
        cores: "0,1",
        extra: &[],
        alone: THREE,
        opencl: true,
        same_plan_as: None,
    },
    Config {
        name: "DP 3 vendors (2 cores)",
        plan: "auto-dp",
        devices: "cobalt:0,ferrite:0,opencl:0",
        cores: "0,1",
        extra: &[],
        alone: THREE,
        opencl: true,
        same_plan_as: None,
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

/// A plan's description as `c` runs it: a configuration that sets the
/// schedule (`--schedule`) or the run-ahead (`--run-ahead`) runs its plan
/// under those.
fn with_schedule(c: &Config, described: String) -> String {
    let flag = |name: &str| c.extra.windows(2).find(|w| w[0] == name).map(|w| w[1]);
    let (schedule, ahead) = (flag("--schedule"), flag("--run-ahead"));
    if schedule.is_none() && ahead.is_none() {
        return described;
    }
    let (rest, planned_ahead) = match described.rsplit_once(", run-ahead ") {
        Some((rest, a)) => (rest, Some(a)),
        None => (described.as_str(), None),
    };
    let (layout, planned) = ["1f1b", "zero-bubble"]
        .iter()
        .find_map(|s| Some((rest.strip_suffix(&format!(", {s}"))?, Some(*s))))
        .unwrap_or((rest, None));
    let mut out = layout.to_string();
    if let Some(s) = schedule.or(planned) {
        out.push_str(&format!(", {s}"));
    }
    if let Some(a) = ahead.or(planned_ahead).filter(|a| *a != "1") {
        out.push_str(&format!(", run-ahead {a}"));
    }
    out
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

/// A process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// A CPU hog: a busy shell loop free to run on any core, or bound to
    /// `core` (with taskset).
    fn hog(core: Option<usize>) -> Process {
        let busy = ["sh", "-c", "while :; do :; done"];
        let mut cmd = match core {
            None => Command::new(busy[0]),
            Some(c) => {
                let mut t = Command::new("taskset");
                t.args(["-c", &c.to_string(), busy[0]]);
                t
            }
        };
        Process(cmd.args(&busy[1..]).spawn().expect("start a CPU hog"))
    }

    /// Sends `sig` (`STOP`, `CONT`) with kill(1).
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.0.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {}", self.0.id());
    }
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Figures {
    tokens_per_s: f64,
    step: f64,
    predicted: f64,
}

/// How a run is laid out.
#[derive(Debug, Clone, Copy)]
enum Layout<'a> {
    /// HeteroAuto's search (the configuration's `--plan` mode).
    Search,
    /// A saved plan.
    File(&'a Path),
    /// The whole model on the configuration's device in micro-batches of
    /// this size.
    Whole(usize),
}

/// What every run of the bench shares.
struct Bench<'a> {
    exe: &'a Path,
    opencl: Option<&'a Path>,
    dir: &'a Path,
    model: &'a str,
    gb: usize,
    /// The global batch of the slow types alone (Cobalt, OpenCL).
    slow_gb: usize,
    /// `--profile-error` for the planning (`PROFILE_ERROR`), when set.
    profile_error: Option<String>,
}

impl Bench<'_> {
    /// A `polychip train` command of `c` on `cores`, laid out as `layout`
    /// says.
    fn command(&self, c: &Config, cores: &str, layout: Layout<'_>) -> Command {
        let mut cmd = Command::new(self.exe);
        if let (true, Some(lib)) = (c.opencl, self.opencl) {
            cmd.env("POLYCHIP_PLUGIN_PATH", lib);
        }
        cmd.args(["train", "--model", self.model])
            .args(["--log-every", "0", "--eval-every", "0"])
            .args(["--global-batch", &self.global_batch(c).to_string()])
            .args(["--cores", cores])
            .env("POLYCHIP_TRANSPORT", "shm");
        match layout {
            Layout::Search => {
                cmd.args(["--plan", c.plan, "--devices", c.devices]);
                if let Some(e) = &self.profile_error {
                    cmd.args(["--profile-error", e]);
                }
                &mut cmd
            }
            Layout::File(p) => cmd.arg("--plan").arg(p),
            Layout::Whole(b) => cmd
                .args(["--device", c.devices, "--micro-batch-size"])
                .arg(b.to_string()),
        };
        cmd.args(c.extra);
        cmd
    }

    /// The global batch `c` runs at: the slow types alone at `slow_gb`.
    fn global_batch(&self, c: &Config) -> usize {
        match c.name {
            "cobalt alone" | "opencl alone" => self.slow_gb,
            _ => self.gb,
        }
    }

    fn file(&self, c: &Config, what: &str) -> PathBuf {
        self.dir.join(format!(
            "{}{what}",
            c.name.replace([' ', '+', '(', ')'], "-")
        ))
    }

    /// Plans `c` once on `cores` by `layout` (`--save-plan`, into a file
    /// named after `c` and `tag`): the plan's file, its description
    /// and the efficiency the planner predicted for it (its
    /// HeteroSpeedupRatio, over each device alone at its best size in
    /// the same profile, so the machine's drift since cancels out).
    fn plan(
        &self,
        c: &Config,
        cores: &str,
        tag: &str,
        layout: Layout<'_>,
    ) -> (PathBuf, String, Option<f64>) {
        let file = self.file(c, &format!("{tag}.plan.json"));
        let mut cmd = self.command(c, cores, layout);
        let out = cmd
            .arg("--save-plan")
            .arg(&file)
            .output()
            .expect("run polychip train --save-plan");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "planning {}: {text}{}",
            c.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut described = text
            .lines()
            .find_map(|l| l.split_once(": ").filter(|_| l.starts_with("plan written")))
            .map_or(String::new(), |(_, d)| d.to_string());
        // With more ranks than cores, which devices share a core (the
        // planner chooses it).
        let err = String::from_utf8_lossy(&out.stderr);
        if let Some((_, sharing)) = err.lines().find_map(|l| {
            l.split_once(" cores: ")
                .filter(|_| l.contains(" ranks on "))
        }) {
            described.push_str(&format!(" ({sharing})"));
        }
        let ratio = err.lines().find_map(|l| {
            let (_, r) = l.split_once("HeteroSpeedupRatio ")?;
            r.trim().trim_end_matches('%').parse::<f64>().ok()
        });
        (file, described, ratio)
    }

    /// Runs `c` on `cores` under its saved plan for `steps` steps.
    fn run(&self, c: &Config, cores: &str, plan: &Path, steps: u64) -> Figures {
        let json = self.file(c, ".run.json");
        let out = self
            .command(c, cores, Layout::File(plan))
            .args(["--steps", &steps.to_string(), "--log-json"])
            .arg(&json)
            .output()
            .expect("run polychip train");
        assert!(
            out.status.success(),
            "{}: {}{}",
            c.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect("the run's summary"))
                .expect("a JSON summary");
        let s = &v["summary"];
        Figures {
            tokens_per_s: s["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
            step: s["median_step_seconds"].as_f64().unwrap_or(f64::NAN),
            predicted: v["plan"]["predicted_step_seconds"]
                .as_f64()
                .unwrap_or(f64::NAN),
        }
    }

    /// A long training run of type alone `c` on `core`, paused: the load
    /// the other type's alone runs are timed beside.
    fn load(&self, c: &Config, core: &str, plan: &Path) -> Process {
        let log =
            std::fs::File::create(self.file(c, &format!(".load{core}.log"))).expect("a load's log");
        let p = Process(
            self.command(c, core, Layout::File(plan))
                .args(["--steps", "1000000"])
                .stdout(log.try_clone().expect("a log handle"))
                .stderr(log)
                .spawn()
                .expect("start a load"),
        );
        p.signal("STOP");
        p
    }
}

/// The cores of `c` in round `round`: the two cores are not quite alike,
/// so odd rounds swap them.
fn cores_in_round(c: &Config, round: usize) -> String {
    match round % 2 {
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
    }
}

/// The other of the two cores.
fn other_core(core: &str) -> &'static str {
    if core == "0" { "1" } else { "0" }
}

/// Median, min, max and standard deviation of `v`, and the rounds a
/// median stable to one point would need (the standard error of a median
/// is about 1.25 sigma / sqrt(n)).
fn stats(v: &[f64]) -> (f64, f64, f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sigma = (v.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    (
        median(v.to_vec()),
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        sigma,
        (1.25 * sigma).powi(2).ceil().max(1.0),
    )
}

/// How an alone figure was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Condition {
    Beside,
    Quiet,
}

impl Condition {
    fn label(self) -> &'static str {
        match self {
            Condition::Beside => "beside",
            Condition::Quiet => "quiet",
        }
    }
}

fn main() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_polychip"));
    let rounds: usize = env_or("ROUNDS", 5);
    let steps: u64 = env_or("STEPS", 10);
    let slow_steps: u64 = env_or("SLOW_STEPS", 4);
    let gb: usize = env_or("GLOBAL_BATCH", 64);
    let slow_gb: usize = env_or("SLOW_GLOBAL_BATCH", gb);
    let model = std::env::var("MODEL").unwrap_or_else(|_| "deep".into());
    let mut conditions: Vec<Condition> = match std::env::var("ALONE").as_deref() {
        Ok("beside") | Err(_) => vec![Condition::Beside],
        Ok("quiet") => vec![Condition::Quiet],
        Ok("both") => vec![Condition::Beside, Condition::Quiet],
        Ok(other) => panic!("ALONE is {other:?}; it is beside, quiet or both"),
    };
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
    let mixed: Vec<&Config> = MIXED
        .iter()
        .filter(|c| {
            (!c.opencl || opencl.is_some())
                && (only.is_empty()
                    || only
                        .iter()
                        .any(|o| c.name.to_lowercase().contains(o.as_str())))
        })
        .collect();
    let three = mixed.iter().any(|c| c.alone == THREE);
    if three && !conditions.contains(&Condition::Quiet) {
        // Three devices on two cores: their efficiency is over each alone
        // on a core of its own, on an idle machine.
        conditions.push(Condition::Quiet);
    }
    let bench = Bench {
        exe: &exe,
        opencl: opencl.as_deref(),
        dir: &dir,
        model: &model,
        gb,
        slow_gb,
        profile_error: std::env::var("PROFILE_ERROR")
            .ok()
            .filter(|e| !e.is_empty()),
    };
    // `HOG=1`: a hog free to run on either core; `HOG=core:N`: bound to
    // core N, a load on one chip only.
    let hog_var = std::env::var("HOG").unwrap_or_default();
    let hog_core: Option<usize> = hog_var.strip_prefix("core:").map(|n| {
        n.parse()
            .unwrap_or_else(|_| panic!("HOG={hog_var}: give core:N with N a core number"))
    });
    let hog = hog_var == "1" || hog_core.is_some();

    // Plan every configuration once. The loads first (HeteroAuto's plan of
    // each type, on an idle machine), then each type alone: its best
    // micro-batch size, measured (short runs at 4, 2 and 1 sequences, under
    // the first condition it is measured in), so that the denominator is
    // each type at its best and not at the choice of one noisy profile
    // (HeteroAuto's own choice is printed beside it); then the mixed
    // configurations, each by HeteroAuto.
    println!(
        "# polychip train efficiency: model {model}, global batch {gb}, {steps} steps \
         ({slow_steps} steps of {slow_gb} sequences for the slow types alone), {rounds} rounds"
    );
    let beside = conditions.contains(&Condition::Beside);
    let loads: Vec<Vec<Process>> = match beside {
        false => Vec::new(),
        true => TWO
            .iter()
            .map(|&j| {
                let c = &ALONE[j];
                let (plan, ..) = bench.plan(c, c.cores, ".load", Layout::Search);
                ["0", "1"]
                    .iter()
                    .map(|core| bench.load(c, core, &plan))
                    .collect()
            })
            .collect(),
    };
    // Runs type alone `j` under condition `cond` on `cores` with `plan`.
    let alone_with = |j: usize, cores: &str, cond: Condition, plan: &Path, n: u64| -> Figures {
        let c = &ALONE[j];
        let load = match (cond, TWO.contains(&j)) {
            (Condition::Beside, true) => {
                let other = 1 - j;
                let l = &loads[other][usize::from(other_core(cores) == "1")];
                l.signal("CONT");
                Some(l)
            }
            _ => None,
        };
        let r = bench.run(c, cores, plan, n);
        if let Some(l) = load {
            l.signal("STOP");
        }
        r
    };
    let mut alone_plans: Vec<Option<(PathBuf, String)>> = vec![None; ALONE.len()];
    let alone_types: Vec<usize> = match three {
        true => THREE.to_vec(),
        false => TWO.to_vec(),
    };
    for &j in &alone_types {
        let c = &ALONE[j];
        let (_, auto, _) = bench.plan(c, c.cores, ".auto", Layout::Search);
        let cond = match j {
            OPENCL => Condition::Quiet,
            _ => conditions[0],
        };
        let n = if j == FERRITE { steps.min(6) } else { 2 };
        let mut tried: Vec<(f64, PathBuf, String, usize)> = Vec::new();
        for b in [4, 2, 1] {
            let (file, described, _) = bench.plan(c, c.cores, &format!(".b{b}"), Layout::Whole(b));
            let r = alone_with(j, c.cores, cond, &file, n);
            tried.push((r.tokens_per_s, file, described, b));
        }
        let (_, file, described, _) = tried
            .iter()
            .max_by(|x, y| x.0.total_cmp(&y.0))
            .cloned()
            .expect("three sizes tried");
        let sizes: Vec<String> = tried
            .iter()
            .map(|(t, _, _, b)| format!("b={b}: {t:.0}"))
            .collect();
        println!(
            "plan of {:<28} {described} (fastest of {} tokens/s, {}; HeteroAuto's: {auto})",
            c.name,
            sizes.join(", "),
            cond.label()
        );
        alone_plans[j] = Some((file, described));
    }
    let mut mixed_plans: Vec<(PathBuf, String)> = Vec::new();
    // The efficiency each plan was predicted (none for a plan run under
    // flags it was not priced with).
    let mut predicted_eff: Vec<Option<f64>> = Vec::new();
    for c in &mixed {
        let same = c
            .same_plan_as
            .and_then(|other| mixed.iter().position(|m| m.name == other))
            .filter(|&i| i < mixed_plans.len());
        let (file, described, ratio) = match same {
            Some(i) => (mixed_plans[i].0.clone(), mixed_plans[i].1.clone(), None),
            None => bench.plan(c, c.cores, "", Layout::Search),
        };
        predicted_eff.push(ratio);
        mixed_plans.push((file, with_schedule(c, described)));
    }
    for (c, (_, d)) in mixed.iter().zip(&mixed_plans) {
        println!("plan of {:<28} {d}", c.name);
    }
    let plan_of = |j: usize| alone_plans[j].as_ref().expect("planned").0.clone();
    let alone_run = |j: usize, cores: &str, cond: Condition, n: u64| -> Figures {
        alone_with(j, cores, cond, &plan_of(j), n)
    };

    // alone[cond][j]: every alone run; per_round[cond][j][round]: the slow
    // types' figure of each round.
    let nc = conditions.len();
    let mut alone: Vec<Vec<Vec<Figures>>> = vec![vec![Vec::new(); ALONE.len()]; nc];
    let mut slow_by_round: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); ALONE.len()]; nc];
    // results[i]: mixed config i's runs; effs[cond][i]: its efficiency by
    // round over the Ferrite run just before it and the round's others.
    let mut results: Vec<Vec<Figures>> = vec![Vec::new(); mixed.len()];
    let mut hogged: Vec<Vec<Figures>> = vec![Vec::new(); mixed.len()];
    let mut effs: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); mixed.len()]; nc];
    for round in 0..rounds {
        for (k, &cond) in conditions.iter().enumerate() {
            let slow: Vec<usize> = match three {
                true => vec![COBALT, OPENCL],
                false => vec![COBALT],
            };
            for j in slow {
                if j == OPENCL && cond == Condition::Beside {
                    continue;
                }
                let cores = cores_in_round(&ALONE[j], round);
                let r = alone_run(j, &cores, cond, slow_steps);
                eprintln!(
                    "round {}: {:<28} {:>9.0} tokens/s ({})",
                    round + 1,
                    ALONE[j].name,
                    r.tokens_per_s,
                    cond.label()
                );
                slow_by_round[k][j].push(r.tokens_per_s);
                alone[k][j].push(r);
            }
        }
        for (i, c) in mixed.iter().enumerate() {
            let mut fast: Vec<f64> = Vec::new();
            for (k, &cond) in conditions.iter().enumerate() {
                let cores = cores_in_round(&ALONE[FERRITE], round);
                let r = alone_run(FERRITE, &cores, cond, steps);
                fast.push(r.tokens_per_s);
                alone[k][FERRITE].push(r);
            }
            let cores = cores_in_round(c, round);
            let r = bench.run(c, &cores, &mixed_plans[i].0, steps);
            eprintln!(
                "round {}: {:<28} {:>9.0} tokens/s (Ferrite alone just before: {})",
                round + 1,
                c.name,
                r.tokens_per_s,
                fast.iter()
                    .map(|t| format!("{t:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for (k, &cond) in conditions.iter().enumerate() {
                if c.alone == THREE && cond == Condition::Beside {
                    continue;
                }
                let others: f64 = c
                    .alone
                    .iter()
                    .filter(|&&j| j != FERRITE)
                    .map(|&j| slow_by_round[k][j][round])
                    .sum();
                effs[k][i].push(100.0 * r.tokens_per_s / (fast[k] + others));
            }
            results[i].push(r);
            if hog {
                let _h = Process::hog(hog_core);
                let r = bench.run(c, &cores, &mixed_plans[i].0, steps);
                eprintln!(
                    "round {}: {:<28} {:>9.0} tokens/s beside a CPU hog",
                    round + 1,
                    c.name,
                    r.tokens_per_s
                );
                hogged[i].push(r);
            }
        }
    }
    drop(loads);

    let tps = |v: &[Figures]| median(v.iter().map(|x| x.tokens_per_s).collect());
    println!();
    println!(
        "{:<30} {:>9} {:>15} {:>9} {:>9} {:>9}  plan",
        "configuration", "tokens/s", "min-max", "step ms", "pred. ms", "pred.err"
    );
    let row = |name: &str, runs: &[Figures], plan: &str| {
        if runs.is_empty() {
            return;
        }
        let step = median(runs.iter().map(|x| x.step).collect());
        let pred = median(runs.iter().map(|x| x.predicted).collect());
        let t: Vec<f64> = runs.iter().map(|x| x.tokens_per_s).collect();
        let (_, lo, hi, _, _) = stats(&t);
        let (pred, err) = match pred.is_finite() {
            true => (
                format!("{:.1}", pred * 1e3),
                format!("{:.1}%", (step / pred - 1.0) * 100.0),
            ),
            false => ("-".into(), "-".into()),
        };
        println!(
            "{:<30} {:>9.0} {:>15} {:>9.1} {:>9} {:>9}  {plan}",
            name,
            tps(runs),
            format!("{lo:.0}-{hi:.0}"),
            step * 1e3,
            pred,
            err,
        );
    };
    for (k, &cond) in conditions.iter().enumerate() {
        for j in [FERRITE, COBALT, OPENCL] {
            let plan = alone_plans[j].as_ref().map_or("", |p| p.1.as_str());
            row(
                &format!("{} ({})", ALONE[j].name, cond.label()),
                &alone[k][j],
                plan,
            );
        }
    }
    for (i, c) in mixed.iter().enumerate() {
        row(c.name, &results[i], &mixed_plans[i].1);
    }
    println!();
    println!(
        "{:<30} {:>10} {:>9} {:>9} {:>7} {:>7} {:>9}  over",
        "efficiency by round", "median", "min", "max", "sigma", "rounds", "predicted"
    );
    for (k, &cond) in conditions.iter().enumerate() {
        for (i, c) in mixed.iter().enumerate() {
            if effs[k][i].is_empty() {
                continue;
            }
            let (m, lo, hi, sigma, need) = stats(&effs[k][i]);
            let predicted = predicted_eff[i].map_or("-".into(), |p| format!("{p:.1}%"));
            println!(
                "{:<30} {:>9.2}% {:>8.2}% {:>8.2}% {:>7.2} {:>7} {:>9}  each alone {}: Ferrite \
                 right before, the others of the round",
                c.name,
                m,
                lo,
                hi,
                sigma,
                need,
                predicted,
                cond.label()
            );
        }
    }
    if hog {
        println!();
        println!(
            "{:<30} {:>9} {:>9} {:>15} {:>8} {:>10}",
            "beside a CPU hog", "quiet", "with hog", "hog min-max", "kept", "hog leaves"
        );
        for (i, c) in mixed.iter().enumerate() {
            if hogged[i].is_empty() {
                continue;
            }
            let with = tps(&hogged[i]);
            let ranks = c.devices.split(',').count();
            let leaves = match hog_core {
                // Ranks of the configuration plus the hog on `cores` cores.
                None => (cores as f64 / (ranks as f64 + 1.0)).min(1.0),
                // The hog takes its share of one core (beside the ranks
                // bound there, one when each has a core of its own).
                Some(_) => {
                    let on_core = ranks.div_ceil(cores).max(1) as f64;
                    (cores as f64 - 1.0 / (on_core + 1.0)) / cores as f64
                }
            };
            let t: Vec<f64> = hogged[i].iter().map(|x| x.tokens_per_s).collect();
            let (_, lo, hi, _, _) = stats(&t);
            println!(
                "{:<30} {:>9.0} {:>9.0} {:>15} {:>7.1}% {:>9.1}%",
                c.name,
                tps(&results[i]),
                with,
                format!("{lo:.0}-{hi:.0}"),
                with / tps(&results[i]) * 100.0,
                leaves * 100.0
            );
        }
    }
    if opencl.is_none() {
        println!(
            "three vendors: not measured (the OpenCL plugin is not built beside the binary, or \
             finds no OpenCL device)"
        );
    } else if three {
        println!(
            "three vendors: three devices on two cores (which share a core: the plan's line), \
             against each alone on a core of its own, quiet"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
