//! Scoring the cost model against training runs someone measured: each
//! run's plan is evaluated ([`crate::evaluate`]) and its predicted step and
//! fit set beside the measured step and outcome; the figures are those
//! issue 16 asks of the planner (Spearman rank correlation, top-1 and
//! top-3 regret, median error as given and after one scale, fit/no-fit
//! agreement). `polychip plan --score RUNS` reads a runs file; the outside
//! datasets' tests (`planner/tests/outside_runs.rs`) use the same figures.
//!
//! A runs file (JSON):
//!
//! ```json
//! {
//!   "settings": { "dtype": "f16", "recompute": "full", "bf16_gradients": true },
//!   "runs": [
//!     { "name": "tp2-pp4-mb2", "plan": { "groups": [ ... ] }, "step_seconds": 12.3 },
//!     { "name": "tp1-pp8-mb4", "plan_file": "plans/tp1-pp8-mb4.json", "ran": false },
//!     { "name": "dp8", "plan": { ... }, "step_seconds": 9.8, "peak_memory_bytes": 7.1e10 }
//!   ]
//! }
//! ```
//!
//! `settings` (optional) are training settings as a plan report records
//! them (`TrainingSettings`, every field optional); a run's plan is any
//! form `--evaluate` reads (inline as `plan`, or a file named by
//! `plan_file`, relative to the runs file), its own recorded settings left
//! aside for the file's. `ran` is true unless given: a run that did not
//! run (out of memory, or refused) has no `step_seconds`. Runs are ranked
//! by seconds per sequence, so runs of different global batches compare.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cluster::ClusterSpec;
use crate::error::SpecError;
use crate::evaluate::{PlanSpec, evaluate};
use crate::model::ModelSpec;
use crate::settings::TrainingSettings;

/// The most runs a runs file may list (each is a whole evaluation).
pub const MAX_RUNS: usize = 10_000;

/// The most stage-micro-batch pairs a runs file's plans may hold together
/// (each plan at most 2^21, about a second of simulation): 10,000 runs of
/// the largest plan, 14 MB of runs file, took more than three hours.
pub const MAX_RUNS_SIMULATED: u64 = 1 << 24;

/// The most bytes a runs file's `plan_file`s may hold together (each at
/// most [`polychip_files::MAX_TEXT_FILE`]): 10,000 runs naming one 64 MiB
/// plan read and parsed it 10,000 times.
pub const MAX_PLAN_FILE_BYTES: u64 = polychip_files::MAX_TEXT_FILE;

/// A measured step's range, in seconds: a nanosecond to some 30 years.
/// Beyond it the figures overflow (a step of 5e-324 s made the ratio and
/// the regret infinite, 1e308 s printed 300-digit numbers).
pub const STEP_SECONDS: (f64, f64) = (1e-9, 1e9);

/// One measured run of a runs file.
#[derive(Debug, Clone)]
pub struct MeasuredRun {
    /// Its name in the file (the run's index when it has none).
    pub name: String,
    /// Its plan.
    pub plan: PlanSpec,
    /// Its measured seconds per step; `None` when it did not run.
    pub step_seconds: Option<f64>,
    /// The most memory one of its chips held, when measured.
    pub peak_memory_bytes: Option<f64>,
}

/// A runs file, read and checked.
#[derive(Debug, Clone)]
pub struct RunsFile {
    /// The settings every run was trained under (the file's `settings`
    /// over the defaults), when the file gives them.
    pub settings: Option<TrainingSettings>,
    /// The runs, in the file's order.
    pub runs: Vec<MeasuredRun>,
}

impl RunsFile {
    /// Reads a runs file; `plan_file`s are relative to its directory.
    pub fn load(path: &Path) -> Result<RunsFile, SpecError> {
        let text = crate::error::read_file(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_of(&text, base, Some(path)).map_err(|e| SpecError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Reads a runs file's text; `plan_file`s are relative to `base`.
    pub fn parse(text: &str, base: &Path) -> Result<RunsFile, SpecError> {
        Self::parse_of(text, base, None)
    }

    /// [`RunsFile::parse`] of the file `own` (which no run's `plan_file`
    /// may name).
    fn parse_of(text: &str, base: &Path, own: Option<&Path>) -> Result<RunsFile, SpecError> {
        let bad = SpecError::Runs;
        let v = polychip_files::parse_json_value(text)
            .map_err(|e| bad(format!("is not valid JSON: {e}")))?;
        let Some(top) = v.as_object() else {
            return Err(bad("is not a JSON object with \"runs\"".into()));
        };
        if let Some(k) = top
            .keys()
            .find(|k| !["settings", "runs"].contains(&k.as_str()))
        {
            return Err(bad(format!(
                "has an unknown key {}; a runs file has \"settings\" and \"runs\"",
                quoted(k)
            )));
        }
        let settings = match top.get("settings") {
            None | Some(Value::Null) => None,
            Some(s) => {
                // Each run's plan gives its global batch.
                let mut s = s.clone();
                if let Some(o) = s.as_object_mut() {
                    if o.contains_key("global_batch") {
                        return Err(bad(
                            "its settings give a global_batch; each run's plan gives its own \
                             (copies x micro-batch size x micro-batches): leave it out"
                                .into(),
                        ));
                    }
                    o.insert("global_batch".into(), Value::from(1));
                }
                let s = TrainingSettings::deserialize(&s)
                    .map_err(|e| bad(format!("its settings are not training settings: {e}")))?;
                s.validate()?;
                Some(s)
            }
        };
        let Some(list) = top.get("runs").and_then(Value::as_array) else {
            return Err(bad("has no \"runs\" list".into()));
        };
        if list.is_empty() || list.len() > MAX_RUNS {
            return Err(bad(format!(
                "lists {} runs; a runs file lists 1 to {MAX_RUNS}",
                list.len()
            )));
        }
        let mut plan_bytes = 0;
        let mut runs: Vec<MeasuredRun> = Vec::with_capacity(list.len());
        let mut simulated = 0u64;
        for (i, r) in list.iter().enumerate() {
            let run = MeasuredRun::from_value(i, r, base, own, &mut plan_bytes)?;
            if runs.iter().any(|o| o.name == run.name) {
                return Err(bad(format!(
                    "names two runs {}; give each run its own name",
                    quoted(&run.name)
                )));
            }
            simulated = simulated.saturating_add(run.plan.simulated_pairs());
            if simulated > MAX_RUNS_SIMULATED {
                return Err(bad(format!(
                    "has more stage-micro-batch pairs to simulate in its first {} runs' plans \
                     together (stages times micro-batches, {simulated}) than the \
                     {MAX_RUNS_SIMULATED} a runs file may; score its runs in several files",
                    i + 1
                )));
            }
            runs.push(run);
        }
        Ok(RunsFile { settings, runs })
    }
}

const RUN_KEYS: &[&str] = &[
    "name",
    "plan",
    "plan_file",
    "step_seconds",
    "ran",
    "peak_memory_bytes",
];

impl MeasuredRun {
    /// Run `i` of a runs file; `plan_bytes` counts the bytes of the plan
    /// files read so far.
    fn from_value(
        i: usize,
        v: &Value,
        base: &Path,
        own: Option<&Path>,
        plan_bytes: &mut u64,
    ) -> Result<MeasuredRun, SpecError> {
        let Some(o) = v.as_object() else {
            return Err(SpecError::Runs(format!("run {i} is not a JSON object")));
        };
        let name = match o.get("name") {
            None => format!("run {i}"),
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 200 => s.clone(),
            Some(_) => {
                return Err(SpecError::Runs(format!(
                    "run {i}: its name is not a string of 1 to 200 bytes"
                )));
            }
        };
        let said = quoted(&name);
        let bad = |m: String| SpecError::Runs(format!("run {said}: {m}"));
        if let Some(k) = o.keys().find(|k| !RUN_KEYS.contains(&k.as_str())) {
            return Err(bad(format!(
                "unknown key {} (a run has {})",
                quoted(k),
                RUN_KEYS.join(", ")
            )));
        }
        let plan = match (o.get("plan"), o.get("plan_file")) {
            (Some(p), None) => {
                PlanSpec::parse(&p.to_string(), true).map_err(|e| bad(e.to_string()))?
            }
            (None, Some(Value::String(f))) => {
                let path = base.join(f);
                if own.is_some_and(|own| polychip_files::same_file(own, &path)) {
                    return Err(bad(format!(
                        "its plan_file {} is the runs file itself; name the plan's own file",
                        quoted(f)
                    )));
                }
                *plan_bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
                if *plan_bytes > MAX_PLAN_FILE_BYTES {
                    return Err(bad(format!(
                        "its plan_file {} brings the plan files read to {} bytes, more than the \
                         {MAX_PLAN_FILE_BYTES} a runs file's plan files may hold together",
                        quoted(f),
                        *plan_bytes
                    )));
                }
                PlanSpec::load(&path).map_err(|e| bad(e.of_plan_file(&path).to_string()))?
            }
            (None, Some(_)) => return Err(bad("plan_file is not a string".into())),
            _ => {
                return Err(bad(
                    "give its plan as \"plan\" or \"plan_file\", one of the two".into(),
                ));
            }
        };
        let number =
            |key: &str, (lo, hi): (f64, f64), range: &str| -> Result<Option<f64>, SpecError> {
                match o.get(key) {
                    None | Some(Value::Null) => Ok(None),
                    Some(x) => match x.as_f64() {
                        Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                        _ => Err(bad(format!("{key} is {x}; it is a number of {range}"))),
                    },
                }
            };
        let step_seconds = number("step_seconds", STEP_SECONDS, "seconds from 1e-9 to 1e9")?;
        let memory = (1.0, crate::cluster::MAX_MEMORY_BYTES as f64);
        let peak_memory_bytes = number(
            "peak_memory_bytes",
            memory,
            "bytes from 1 to 1125899906842624 (1 PiB)",
        )?;
        let ran = match o.get("ran") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(x) => return Err(bad(format!("ran is {x}; it is true or false"))),
        };
        match (ran, step_seconds) {
            (true, None) => {
                return Err(bad(
                    "has no step_seconds; a run that did not run says \"ran\": false".into(),
                ));
            }
            (false, Some(_)) => {
                return Err(bad(
                    "did not run (\"ran\": false) but gives step_seconds".into()
                ));
            }
            _ => {}
        }
        Ok(MeasuredRun {
            name,
            plan,
            step_seconds,
            peak_memory_bytes,
        })
    }
}

/// One run, predicted beside measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredRun {
    /// The run's name.
    pub name: String,
    /// Its plan's sequences per step.
    pub global_batch: u64,
    /// The predicted (simulated) seconds per step.
    pub predicted_step_seconds: f64,
    /// The measured seconds per step; `None` when it did not run.
    pub measured_step_seconds: Option<f64>,
    /// Whether the model predicts it fits (and can run).
    pub predicted_fits: bool,
    /// Whether it ran.
    pub ran: bool,
    /// The most memory the model predicts one of its chips holds.
    pub predicted_peak_memory_bytes: f64,
    /// The most memory one of its chips held, when measured.
    pub measured_peak_memory_bytes: Option<f64>,
}

/// The figures of a set of runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// The runs that ran (the timing figures are over these).
    pub ran: usize,
    /// Spearman's rank correlation of predicted and measured seconds per
    /// sequence (`None` below two runs, or when either side is constant).
    pub spearman: Option<f64>,
    /// How much slower the run predicted fastest measured than the fastest
    /// measured run (0.05: 5%).
    pub top1_regret: Option<f64>,
    /// The same for the best measured of the three predicted fastest.
    pub top3_regret: Option<f64>,
    /// Median of |predicted - measured| / measured.
    pub median_error: Option<f64>,
    /// The one factor that best maps predictions onto measurements (the
    /// geometric mean of measured over predicted).
    pub scale: Option<f64>,
    /// The median error after multiplying every prediction by `scale`.
    pub median_error_scaled: Option<f64>,
    /// Runs whose predicted fit agrees with their outcome.
    pub fit_agreement: usize,
    /// All runs.
    pub runs: usize,
    /// The runs predicted to fit that did not run.
    pub predicted_to_fit_but_failed: Vec<String>,
    /// The runs predicted not to fit that ran.
    pub predicted_not_to_fit_but_ran: Vec<String>,
    /// Median of (predicted - measured) / measured peak memory, over the
    /// runs that ran and give it (a failed run's peak is what it held when
    /// it failed, not what it needed).
    pub median_memory_error: Option<f64>,
    /// The runs [`Scores::median_memory_error`] is over.
    pub memory_runs: usize,
}

/// Every run of `file` evaluated on `cluster` (its profile applied) for
/// `model` under `settings`.
pub fn score_runs(
    file: &RunsFile,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
) -> Result<Vec<ScoredRun>, SpecError> {
    file.runs
        .iter()
        .map(|run| {
            let ev = evaluate(&run.plan, model, cluster, settings)
                .map_err(|e| SpecError::Runs(format!("run {}: {e}", quoted(&run.name))))?;
            let peak = ev.peak_memory_bytes();
            Ok(ScoredRun {
                name: run.name.clone(),
                global_batch: ev.plan.global_batch,
                predicted_step_seconds: ev.plan.step_time_simulated,
                measured_step_seconds: run.step_seconds,
                predicted_fits: ev.fits,
                ran: run.step_seconds.is_some(),
                predicted_peak_memory_bytes: peak,
                measured_peak_memory_bytes: run.peak_memory_bytes,
            })
        })
        .collect()
}

/// The figures of `runs`.
pub fn scores(runs: &[ScoredRun]) -> Scores {
    let per_sequence = |s: f64, r: &ScoredRun| s / r.global_batch.max(1) as f64;
    let (p, m): (Vec<f64>, Vec<f64>) = runs
        .iter()
        .filter_map(|r| {
            let measured = r.measured_step_seconds?;
            Some((
                per_sequence(r.predicted_step_seconds, r),
                per_sequence(measured, r),
            ))
        })
        .unzip();
    let some = !p.is_empty();
    let scale = some.then(|| one_scale(&p, &m));
    // A run that did not fit has no meaningful measured peak (what it held
    // when it failed): it counted in the median until 2026-12-06.
    let memory: Vec<f64> = runs
        .iter()
        .filter(|r| r.ran)
        .filter_map(|r| {
            let m = r.measured_peak_memory_bytes?;
            Some((r.predicted_peak_memory_bytes - m) / m)
        })
        .collect();
    let names = |keep: &dyn Fn(&ScoredRun) -> bool| -> Vec<String> {
        runs.iter()
            .filter(|r| keep(r))
            .map(|r| r.name.clone())
            .collect()
    };
    Scores {
        ran: p.len(),
        spearman: Some(spearman(&p, &m)).filter(|s| s.is_finite()),
        top1_regret: some.then(|| topk_regret(&p, &m, 1)),
        top3_regret: some.then(|| topk_regret(&p, &m, 3)),
        median_error: some.then(|| median_error(&p, &m, 1.0)),
        scale,
        median_error_scaled: scale.map(|s| median_error(&p, &m, s)),
        fit_agreement: runs.iter().filter(|r| r.predicted_fits == r.ran).count(),
        runs: runs.len(),
        predicted_to_fit_but_failed: names(&|r| r.predicted_fits && !r.ran),
        predicted_not_to_fit_but_ran: names(&|r| !r.predicted_fits && r.ran),
        memory_runs: memory.len(),
        median_memory_error: (!memory.is_empty()).then(|| median(memory)),
    }
}

/// `text` in quotes with what is not printable escaped (Rust's `{:?}`), cut
/// after [`polychip_files::MAX_SHOWN`] characters: a key or a name from
/// the file, shown in a message.
fn quoted(text: &str) -> String {
    let cut: String = text.chars().take(polychip_files::MAX_SHOWN).collect();
    match cut.len() < text.len() {
        true => format!("{cut:?}… ({} bytes)", text.len()),
        false => format!("{cut:?}"),
    }
}

/// Ranks of `v` (1-based; ties get their mean rank).
pub fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        for &k in &idx[i..=j] {
            r[k] = (i + j) as f64 / 2.0 + 1.0;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation: Pearson's over the ranks (NaN when fewer
/// than two values, or when either side is constant).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

/// The median (NaN of none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The one scale that best maps predictions onto measurements: the
/// geometric mean of measured over predicted (what setting the chips'
/// efficiency to what they ran at does).
pub fn one_scale(predicted: &[f64], measured: &[f64]) -> f64 {
    let logs: f64 = measured
        .iter()
        .zip(predicted)
        .map(|(m, p)| (m / p).ln())
        .sum();
    (logs / predicted.len() as f64).exp()
}

/// The median of |scale x predicted - measured| / measured.
pub fn median_error(predicted: &[f64], measured: &[f64], scale: f64) -> f64 {
    median(
        predicted
            .iter()
            .zip(measured)
            .map(|(p, m)| (scale * p - m).abs() / m)
            .collect(),
    )
}

/// How much slower the fastest measured of the `k` runs predicted fastest
/// is than the fastest measured run (top-1 regret when `k` is 1).
pub fn topk_regret(predicted: &[f64], measured: &[f64], k: usize) -> f64 {
    let best = measured.iter().copied().fold(f64::INFINITY, f64::min);
    let mut order: Vec<usize> = (0..predicted.len()).collect();
    order.sort_by(|&a, &b| predicted[a].total_cmp(&predicted[b]));
    let chosen = order
        .iter()
        .take(k)
        .map(|&i| measured[i])
        .fold(f64::INFINITY, f64::min);
    chosen / best - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_of_known_rankings() {
        assert_eq!(ranks(&[3.0, 1.0, 2.0, 2.0]), [4.0, 1.0, 2.5, 2.5]);
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[30.0, 20.0, 10.0]) + 1.0).abs() < 1e-12);
        assert!(spearman(&[1.0], &[1.0]).is_nan());
        // Predicted fastest is the second fastest measured: 20% regret;
        // the best of the top three is the fastest.
        let (p, m) = ([1.0, 2.0, 3.0, 4.0], [1.2, 1.5, 1.0, 2.0]);
        assert!((topk_regret(&p, &m, 1) - 0.2).abs() < 1e-12);
        assert_eq!(topk_regret(&p, &m, 3), 0.0);
        assert!((one_scale(&[1.0, 4.0], &[2.0, 2.0]) - 1.0).abs() < 1e-12);
        assert!((median_error(&[1.0, 2.0, 4.0], &[1.0, 1.0, 1.0], 1.0) - 1.0).abs() < 1e-12);
    }

    /// A run that failed gives no meaningful peak (what it held when it
    /// failed): it counted in the median memory error until 2026-12-06.
    #[test]
    fn failed_runs_peaks_are_not_in_the_memory_error() {
        let run = |name: &str, ran: bool, measured: f64| ScoredRun {
            name: name.into(),
            global_batch: 8,
            predicted_step_seconds: 1.0,
            measured_step_seconds: ran.then_some(1.0),
            predicted_fits: true,
            ran,
            predicted_peak_memory_bytes: 100.0,
            measured_peak_memory_bytes: Some(measured),
        };
        // The ran run is 25% over; the failed ones' peaks would pull the
        // median to -50%.
        let s = scores(&[
            run("a", true, 80.0),
            run("b", false, 200.0),
            run("c", false, 200.0),
        ]);
        assert_eq!(s.memory_runs, 1);
        assert!(
            (s.median_memory_error.unwrap() - 0.25).abs() < 1e-12,
            "{s:?}"
        );
        let s = scores(&[run("b", false, 200.0)]);
        assert_eq!((s.memory_runs, s.median_memory_error), (0, None));
    }

    #[test]
    fn a_runs_file_says_what_is_wrong_with_a_run() {
        let base = Path::new(".");
        let plan = r#"{"group": [{"copies": 1, "micro_batch_size": 1, "micro_batches": 1, "stages": [{"chip": "x", "layers": [0, 2]}]}]}"#;
        let err = |text: &str| RunsFile::parse(text, base).unwrap_err().to_string();
        assert!(err("[]").contains("is not a JSON object"));
        assert!(err(r#"{"runs": []}"#).contains("lists 0 runs"));
        assert!(err(r#"{"runs": [], "extra": 1}"#).contains("unknown key \"extra\""));
        let one = |run: &str| format!(r#"{{"runs": [{run}]}}"#);
        let e = err(&one(&format!(r#"{{"name": "a", "plan": {plan}}}"#)));
        assert!(e.contains("run \"a\": has no step_seconds"), "{e}");
        let e = err(&one(&format!(
            r#"{{"name": "a", "plan": {plan}, "ran": false, "step_seconds": 1}}"#
        )));
        assert!(e.contains("did not run"), "{e}");
        let e = err(&one(&format!(r#"{{"plan": {plan}, "step_seconds": -1}}"#)));
        assert!(e.contains("run \"run 0\": step_seconds is -1"), "{e}");
        let e = err(&one(r#"{"name": "b", "step_seconds": 1}"#));
        assert!(e.contains("as \"plan\" or \"plan_file\""), "{e}");
        let e = err(&one(
            r#"{"name": "c", "plan_file": "/nonexistent/p.json", "step_seconds": 1}"#,
        ));
        assert!(
            e.contains("run \"c\"") && e.contains("/nonexistent/p.json"),
            "{e}"
        );
        let ok = RunsFile::parse(
            &one(&format!(r#"{{"name": "a", "plan": {plan}, "ran": false}}"#)),
            base,
        )
        .unwrap();
        assert_eq!(ok.runs[0].step_seconds, None);
    }

    #[test]
    fn absurd_runs_files_are_refused_before_anything_is_evaluated() {
        let base = Path::new(".");
        let plan = |m: u64| {
            format!(
                r#"{{"group": [{{"copies": 1, "micro_batch_size": 1, "micro_batches": {m}, "stages": [{{"chip": "x", "layers": [0, 2]}}]}}]}}"#
            )
        };
        let err = |runs: &[String]| {
            RunsFile::parse(&format!(r#"{{"runs": [{}]}}"#, runs.join(",")), base)
                .unwrap_err()
                .to_string()
        };
        let run = |name: &str, extra: &str| {
            format!(r#"{{"name": "{name}", "plan": {}{extra}}}"#, plan(1))
        };
        // Steps and peaks outside physical ranges (5e-324 s made the ratio
        // and regret infinite; 1e308 s printed 300 digits).
        for (extra, says) in [
            (r#", "step_seconds": 5e-324"#, "step_seconds is 5e-324"),
            (r#", "step_seconds": 1e308"#, "step_seconds is 1e+308"),
            (
                r#", "step_seconds": 1, "peak_memory_bytes": 5e-324"#,
                "peak_memory_bytes is 5e-324",
            ),
            (
                r#", "step_seconds": 1, "peak_memory_bytes": 1e300"#,
                "peak_memory_bytes is 1e+300",
            ),
        ] {
            let e = err(&[run("a", extra)]);
            assert!(e.contains(says) && e.contains(" from 1"), "{e}");
        }
        // Two runs of one name (the lists of misses named them alike).
        let e = err(&[
            run("a", r#", "step_seconds": 1"#),
            run("a", r#", "step_seconds": 2"#),
        ]);
        assert!(e.contains("names two runs \"a\""), "{e}");
        // A global batch in the settings (each plan gives its own; it was
        // silently dropped).
        let e = RunsFile::parse(
            &format!(
                r#"{{"settings": {{"global_batch": 7}}, "runs": [{}]}}"#,
                run("a", r#", "step_seconds": 1"#)
            ),
            base,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("global_batch"), "{e}");
        // The plans' simulation, bounded together: 9 plans of 2^21 pairs.
        let big: Vec<String> = (0..9)
            .map(|i| {
                format!(
                    r#"{{"name": "r{i}", "plan": {}, "step_seconds": 1}}"#,
                    plan(1 << 21)
                )
            })
            .collect();
        let e = err(&big);
        assert!(
            e.contains("stage-micro-batch pairs") && e.contains("first 9 runs"),
            "{e}"
        );
        assert!(RunsFile::parse(&format!(r#"{{"runs": [{}]}}"#, big[..8].join(",")), base).is_ok());
    }

    #[test]
    fn a_plan_file_is_neither_the_runs_file_nor_too_much_to_read() {
        let dir = std::env::temp_dir().join(format!("polychip-runs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runs = dir.join("runs.json");
        std::fs::write(
            &runs,
            r#"{"runs": [{"name": "a", "plan_file": "./runs.json", "step_seconds": 1}]}"#,
        )
        .unwrap();
        let e = RunsFile::load(&runs).unwrap_err().to_string();
        assert!(e.contains("is the runs file itself"), "{e}");
        // A small plan file, then one of 64 MiB (sparse: it is refused by
        // its size before a byte of it is read): more than a runs file's
        // plan files may hold together.
        std::fs::write(
            dir.join("p.json"),
            r#"{"group": [{"copies": 1, "micro_batch_size": 1, "micro_batches": 1, "stages": [{"chip": "x", "layers": [0, 2]}]}]}"#,
        )
        .unwrap();
        std::fs::File::create(dir.join("q.json"))
            .unwrap()
            .set_len(MAX_PLAN_FILE_BYTES)
            .unwrap();
        let list = [("r0", "p.json"), ("r1", "q.json")]
            .map(|(n, f)| format!(r#"{{"name": "{n}", "plan_file": "{f}", "step_seconds": 1}}"#));
        let e = RunsFile::parse(&format!(r#"{{"runs": [{}]}}"#, list.join(",")), &dir)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run \"r1\": its plan_file \"q.json\" brings the plan files read to"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
