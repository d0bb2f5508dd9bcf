//! The conformance report: per (operator, dtype) counts and error
//! statistics, every failure with the command that replays it, every waiver
//! in full; as a table for people, JSON for machines and JUnit XML for CI.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::compare::Stats;
use crate::runner::{CaseResult, Status};
use crate::waivers::Waivers;

/// `v` in scientific notation with two decimals and at most two exponent
/// digits shown (`1.79e308` is the widest: 8 characters).
fn sci(v: f64) -> String {
    format!("{v:.2e}")
}

/// `v` with `decimals` decimals while it fits in 8 characters (9 with a
/// sign), else in scientific notation with one decimal (`3.2e9`), so that a
/// huge ULP count or time keeps the table's columns narrow.
fn compact(v: f64, decimals: usize, signed: bool) -> String {
    let fixed = if signed {
        format!("{v:+.decimals$}")
    } else {
        format!("{v:.decimals$}")
    };
    if fixed.len() <= 8 + usize::from(signed) || !v.is_finite() {
        return fixed;
    }
    let sci = format!("{v:.1e}");
    if signed && v >= 0.0 {
        format!("+{sci}")
    } else {
        sci
    }
}

/// One (operator, dtype) row.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// Operator.
    pub op: String,
    /// Dtype.
    pub dtype: String,
    /// Cases passed.
    pub passed: usize,
    /// Cases failed.
    pub failed: usize,
    /// Cases the plugin does not implement.
    pub not_implemented: usize,
    /// Cases skipped by a waiver.
    pub skipped: usize,
    /// Cases passed under a loosened tolerance (also counted in `passed`).
    pub passed_loosened: usize,
    /// Error statistics over the cases that ran.
    pub stats: Stats,
    /// Seconds in the plugin.
    pub plugin_seconds: f64,
    /// Seconds in the reference.
    pub reference_seconds: f64,
}

/// A failed case and how to replay it.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// The result.
    pub result: CaseResult,
    /// A command that runs exactly this case again.
    pub replay: String,
}

/// The whole report for one plugin.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The plugin file.
    pub plugin: String,
    /// Its vendor and version.
    pub vendor: String,
    /// The device index tested.
    pub device: u32,
    /// One row per (operator, dtype), in suite order.
    pub rows: Vec<Row>,
    /// Every failure.
    pub failures: Vec<Failure>,
    /// The waivers in force, in full.
    pub waivers: Waivers,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// What loading the plugin did that the ABI forbids (rules 12 and 13:
    /// the floating-point environment or process state left changed by its
    /// initialisers or entry), each a sentence; any fails the report.
    pub load_findings: Vec<String>,
    /// What loading it did that the ABI discourages but real drivers do
    /// (rule 13: signal handlers installed, the environment changed);
    /// reported, not failed.
    pub load_notes: Vec<String>,
}

impl Report {
    /// Builds the report from results in suite order.
    pub fn new(
        plugin: &str,
        vendor: &str,
        device: u32,
        results: &[CaseResult],
        waivers: &Waivers,
        seconds: f64,
    ) -> Report {
        let mut order = Vec::new();
        let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
        let mut failures = Vec::new();
        for r in results {
            let key = (r.op.clone(), r.dtype.clone());
            if !rows.contains_key(&key) {
                order.push(key.clone());
            }
            let row = rows.entry(key).or_insert_with(|| Row {
                op: r.op.clone(),
                dtype: r.dtype.clone(),
                ..Row::default()
            });
            match r.status {
                Status::Passed => row.passed += 1,
                Status::Failed => row.failed += 1,
                Status::NotImplemented => row.not_implemented += 1,
                Status::Skipped => row.skipped += 1,
            }
            if r.status == Status::Passed && waivers.find(&r.op, &r.dtype).is_some() {
                row.passed_loosened += 1;
            }
            row.stats.merge(&r.stats);
            row.plugin_seconds += r.plugin_seconds;
            row.reference_seconds += r.reference_seconds;
            if r.status == Status::Failed {
                failures.push(Failure {
                    result: r.clone(),
                    replay: format!("polychip conform --plugin {plugin} --device {device} --ops '^{}$' --dtype {} --case {}", r.op, r.dtype, r.index),
                });
            }
        }
        Report {
            plugin: plugin.to_string(),
            vendor: vendor.to_string(),
            device,
            rows: order
                .into_iter()
                .map(|k| rows.remove(&k).expect("ordered keys"))
                .collect(),
            failures,
            waivers: waivers.clone(),
            seconds,
            load_findings: Vec::new(),
            load_notes: Vec::new(),
        }
    }

    /// The report with what loading the plugin did that the ABI forbids
    /// and discourages ([`polychip_host::ffi::Plugin::load_findings`] and
    /// [`polychip_host::ffi::Plugin::load_notes`]).
    pub fn with_load_findings(mut self, findings: Vec<String>, notes: Vec<String>) -> Report {
        self.load_findings = findings;
        self.load_notes = notes;
        self
    }

    /// Totals over every row: (passed, failed, not implemented, skipped).
    pub fn totals(&self) -> (usize, usize, usize, usize) {
        self.rows.iter().fold((0, 0, 0, 0), |t, r| {
            (
                t.0 + r.passed,
                t.1 + r.failed,
                t.2 + r.not_implemented,
                t.3 + r.skipped,
            )
        })
    }

    /// Whether every implemented, unwaived case passed.
    pub fn ok(&self) -> bool {
        self.totals().1 == 0 && self.load_findings.is_empty()
    }

    /// The report as a table for people, for a terminal: what the plugin
    /// said (its errors), the plugin's path and the waivers' reasons are
    /// printed with control and bidirectional characters escaped and lines
    /// cut after 1,000 characters ([`polychip_files::printable_lines`];
    /// until 2026-12-06 a plugin's terminal escapes reached the terminal and
    /// a 4 MiB message was printed whole for each case it failed).
    pub fn table(&self) -> String {
        polychip_files::printable_lines(&self.raw_table())
    }

    fn raw_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "conformance of {} ({}), device {}",
            self.vendor, self.plugin, self.device
        );
        let header = [
            "op",
            "dtype",
            "pass",
            "fail",
            "n/i",
            "skip",
            "max abs",
            "max rel",
            "max ulp",
            "mean ulp",
            "nan/inf",
            "plugin ms",
            "ref ms",
        ];
        let mut lines = vec![header.map(String::from).to_vec()];
        for r in &self.rows {
            let ran = r.stats.elements > 0;
            let num = |v: f64| if ran { sci(v) } else { "-".into() };
            lines.push(vec![
                r.op.clone(),
                r.dtype.clone(),
                if r.passed_loosened > 0 {
                    format!("{}*", r.passed)
                } else {
                    r.passed.to_string()
                },
                r.failed.to_string(),
                r.not_implemented.to_string(),
                r.skipped.to_string(),
                num(r.stats.max_abs),
                num(r.stats.max_rel),
                if ran {
                    compact(r.stats.max_ulp, 1, false)
                } else {
                    "-".into()
                },
                if ran {
                    compact(r.stats.mean_signed_ulp(), 3, true)
                } else {
                    "-".into()
                },
                r.stats.nan_inf_mismatches.to_string(),
                compact(r.plugin_seconds * 1e3, 2, false),
                compact(r.reference_seconds * 1e3, 2, false),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
            .collect();
        for l in &lines {
            let cells: Vec<String> = l
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i < 2 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect();
            // Two spaces after the names, one between the right-aligned
            // figures: the table stays under 110 columns.
            let line = format!("{}  {}  {}", cells[0], cells[1], cells[2..].join(" "));
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let (p, f, n, s) = self.totals();
        let _ = writeln!(
            out,
            "\n{p} passed, {f} failed, {n} not implemented, {s} skipped in {:.1} s",
            self.seconds
        );
        if self.rows.iter().any(|r| r.passed_loosened > 0) {
            let _ = writeln!(
                out,
                "* passed under a loosened tolerance (see the waivers below)"
            );
        }
        if !self.waivers.waivers.is_empty() {
            let _ = writeln!(
                out,
                "\nwaivers from {}:",
                self.waivers.path.as_deref().unwrap_or("?")
            );
            for w in &self.waivers.waivers {
                let dtype = w.dtype.as_deref().unwrap_or("every dtype");
                let what = match w.factor {
                    Some(f) => format!("tolerance x{}", crate::waivers::fmt_factor(f)),
                    None => "skipped".into(),
                };
                let _ = writeln!(out, "  {} {dtype}: {what}: {}", w.op, w.reason);
            }
        }
        for note in &self.load_notes {
            let _ = writeln!(out, "\nnote, loading the plugin: {note}");
        }
        for finding in &self.load_findings {
            let _ = writeln!(out, "\nFAILED loading the plugin: {finding}");
        }
        for f in &self.failures {
            let r = &f.result;
            let _ = writeln!(
                out,
                "\nFAILED {} {} case {} ({}): {}\n  replay: {}",
                r.op, r.dtype, r.index, r.label, r.message, f.replay
            );
        }
        out
    }

    /// The report as JUnit XML: one test suite per operator, one test case
    /// per (operator, dtype, case).
    /// Control characters (a plugin's terminal escapes) are written as
    /// `\u{..}` text: XML 1.0 has no way to hold them, and a report with one
    /// was refused by every XML parser until 2026-12-06.
    pub fn junit(&self, results: &[CaseResult]) -> String {
        let esc = |s: &str| {
            polychip_files::printable(s)
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;")
        };
        let (_, failed, _, skipped) = self.totals();
        let failed = failed + self.load_findings.len();
        let mut out = String::new();
        let _ = writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
        let _ = writeln!(
            out,
            "<testsuites name=\"polychip conformance: {}\" tests=\"{}\" failures=\"{failed}\" skipped=\"{skipped}\" time=\"{:.3}\">",
            esc(&self.vendor),
            results.len() + self.load_findings.len(),
            self.seconds
        );
        if !self.load_findings.is_empty() {
            let _ = writeln!(
                out,
                "  <testsuite name=\"load\" tests=\"{0}\" failures=\"{0}\">",
                self.load_findings.len()
            );
            for (i, finding) in self.load_findings.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "    <testcase classname=\"load\" name=\"loading the plugin #{i}\" \
                     time=\"0\">\n      <failure message=\"{}\"/>\n    </testcase>",
                    esc(finding)
                );
            }
            let _ = writeln!(out, "  </testsuite>");
        }
        let mut ops: Vec<&str> = Vec::new();
        for r in results {
            if !ops.contains(&r.op.as_str()) {
                ops.push(&r.op);
            }
        }
        for op in ops {
            let mine: Vec<&CaseResult> = results.iter().filter(|r| r.op == op).collect();
            let fails = mine.iter().filter(|r| r.status == Status::Failed).count();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{fails}\">",
                esc(op),
                mine.len()
            );
            for r in mine {
                let name = format!("{} {} #{} {}", r.op, r.dtype, r.index, r.label);
                let _ = write!(
                    out,
                    "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{:.6}\"",
                    esc(&r.op),
                    esc(&r.dtype),
                    esc(&name),
                    r.plugin_seconds
                );
                match r.status {
                    Status::Passed => {
                        let _ = writeln!(out, "/>");
                    }
                    Status::Failed => {
                        let _ = writeln!(
                            out,
                            ">\n      <failure message=\"{}\"/>\n    </testcase>",
                            esc(&r.message)
                        );
                    }
                    Status::NotImplemented | Status::Skipped => {
                        let _ = writeln!(
                            out,
                            ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                            esc(&r.message)
                        );
                    }
                }
            }
            let _ = writeln!(out, "  </testsuite>");
        }
        let _ = writeln!(out, "</testsuites>");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Stats;

    fn result(op: &str, dtype: &str, stats: Stats) -> CaseResult {
        CaseResult {
            op: op.into(),
            dtype: dtype.into(),
            index: 0,
            label: "l".into(),
            status: Status::Passed,
            message: String::new(),
            stats,
            plugin_seconds: 1.5e4,
            reference_seconds: 0.25,
        }
    }

    #[test]
    fn huge_figures_keep_the_table_narrow() {
        let huge = Stats {
            elements: 10,
            max_abs: f64::MAX,
            max_rel: 1.0e300,
            max_ulp: 3.2e9 * 1e290,
            sum_magnitude_ulp: -1.0e301,
            finite: 10,
            nan_inf_mismatches: 123,
            ..Stats::default()
        };
        let results = [
            result("cross_entropy_backward", "bf16", huge),
            result(
                "add",
                "f32",
                Stats {
                    elements: 1,
                    finite: 1,
                    max_ulp: 0.5,
                    ..Stats::default()
                },
            ),
        ];
        let report = Report::new("p.so", "V 1", 0, &results, &Waivers::default(), 1.0);
        let table = report.table();
        for line in table.lines().skip(1).take(3) {
            assert!(line.len() <= 110, "{} columns: {line}", line.len());
        }
        assert!(table.contains("3.2e299"), "{table}");
        assert!(table.contains("-1.0e300"), "{table}");
        assert_eq!(compact(12.5, 1, false), "12.5");
        assert_eq!(compact(3.2e9, 1, false), "3.2e9");
        assert_eq!(compact(0.25, 3, true), "+0.250");
    }

    /// What a plugin says (its error messages, with terminal escapes, a
    /// control character, a bidirectional override and no end) reaches
    /// neither the terminal nor the JUnit XML as it is.
    #[test]
    fn a_plugins_words_are_escaped_in_the_table_and_the_junit_report() {
        let mut failed = result("fill", "f32", Stats::default());
        failed.status = Status::Failed;
        failed.message = format!("boom \u{1b}[2J\u{1}\u{202e}{}", "x".repeat(5000));
        let results = [failed];
        let report = Report::new("p\u{7}.so", "V 1", 0, &results, &Waivers::default(), 1.0);
        let table = report.table();
        assert!(
            !table
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{table}"
        );
        assert!(table.contains("boom \\u{1b}[2J\\u{1}\\u{202e}x"), "{table}");
        assert!(
            table.contains("... (4"),
            "a line past 1,000 characters is cut: {table}"
        );
        assert!(table.contains("--plugin p\\u{7}.so"), "{table}");
        let xml = report.junit(&results);
        // XML 1.0 holds no C0 control character but tab, newline and return.
        assert!(
            !xml.chars().any(|c| c.is_control() && !"\t\n\r".contains(c)),
            "{xml}"
        );
        assert!(xml.contains("message=\"boom \\u{1b}[2J\\u{1}"), "{xml}");
    }
}
