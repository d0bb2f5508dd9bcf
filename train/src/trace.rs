//! A Chrome trace (`chrome://tracing`, Perfetto) of the real run: every
//! forward and backward pass of every micro-batch, every transfer between
//! stages, the gradient reduction and the optimizer, one row per rank.
//! Times are wall-clock microseconds, so ranks on one machine line up.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// One span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// What ran, e.g. `F3` (forward of micro-batch 3), `send act 3`.
    pub name: String,
    /// `forward`, `backward` (under a split, the input's gradients),
    /// `weights` (a split backward pass's weights' gradients), `p2p` (a receive, a blocking send, or the
    /// wait for the sender at a step's end), `send` (the sender thread's
    /// sends), `allreduce` (the wait for the reduction), `reduce` (a
    /// bucket's reduction), `optimizer`, `eval`.
    pub cat: &'static str,
    /// Start, microseconds since the Unix epoch.
    pub start_us: f64,
    /// Duration, microseconds.
    pub dur_us: f64,
}

/// Collects spans when enabled. A tracer that is not exporting a trace
/// keeps only the most recent [`RECENT`] spans (enough for the step
/// report's medians), so a long run's memory stays bounded.
#[derive(Debug, Default)]
pub struct Tracer {
    enabled: bool,
    keep_all: bool,
    spans: Vec<Span>,
}

/// The category of the reducer thread's spans (`reduce bucket k`), drawn
/// on a row of their own.
pub const REDUCER_CAT: &str = "reduce";

/// The category of the sender thread's spans (`send act i`, `send grad
/// j`: [`crate::links`]), drawn on a row of their own.
pub const SENDER_CAT: &str = "send";

/// The rows of a rank's trace besides the passes' (tid 0): each thread's
/// category, tid and name.
const ROWS: [(&str, usize, &str); 2] = [
    (REDUCER_CAT, 1, "gradient reduction"),
    (SENDER_CAT, 2, "pipeline sends"),
];

/// Spans a tracer that is not exporting keeps.
pub const RECENT: usize = 20_000;

/// Microseconds since the Unix epoch.
pub fn now_us() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

impl Tracer {
    /// A tracer that records spans when `enabled`, all of them when
    /// `keep_all` (for a trace file), else the most recent [`RECENT`].
    pub fn new(enabled: bool, keep_all: bool) -> Tracer {
        Tracer {
            enabled,
            keep_all,
            spans: Vec::new(),
        }
    }

    /// Runs `f` as a span.
    pub fn span<T>(
        &mut self,
        name: impl FnOnce() -> String,
        cat: &'static str,
        f: impl FnOnce() -> T,
    ) -> T {
        if !self.enabled {
            return f();
        }
        let start = now_us();
        let out = f();
        let dur = now_us() - start;
        self.push(Span {
            name: name(),
            cat,
            start_us: start,
            dur_us: dur,
        });
        out
    }

    /// Adds a span timed elsewhere (another thread's), when enabled.
    pub fn push(&mut self, span: Span) {
        if !self.enabled {
            return;
        }
        if !self.keep_all && self.spans.len() >= RECENT {
            self.spans.drain(..RECENT / 2);
        }
        self.spans.push(span);
    }

    /// The spans so far.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The spans as JSON (for gathering on rank 0).
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.spans
                .iter()
                .map(|s| json!([s.name, s.cat, s.start_us, s.dur_us]))
                .collect(),
        )
    }
}

/// A Chrome trace from each rank's spans (as [`Tracer::to_json`] gives
/// them) and a label per rank; times start at the earliest span.
pub fn chrome_trace(ranks: &[(String, Value)]) -> Value {
    let t0 = ranks
        .iter()
        .filter_map(|(_, v)| v.as_array())
        .flatten()
        .filter_map(|s| s[2].as_f64())
        .fold(f64::INFINITY, f64::min);
    let mut events = Vec::new();
    for (pid, (label, spans)) in ranks.iter().enumerate() {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": { "name": label },
        }));
        let mut named = [false; ROWS.len()];
        for s in spans.as_array().into_iter().flatten() {
            // The reducer's buckets and the sender's transfers overlap the
            // passes: rows of their own.
            let row = ROWS.iter().position(|(cat, _, _)| s[1] == *cat);
            let tid = row.map_or(0, |r| ROWS[r].1);
            if let Some(r) = row
                && !named[r]
            {
                named[r] = true;
                events.push(json!({
                    "name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": { "name": ROWS[r].2 },
                }));
            }
            events.push(json!({
                "name": s[0], "cat": s[1], "ph": "X", "pid": pid, "tid": tid,
                "ts": s[2].as_f64().unwrap_or(0.0) - t0,
                "dur": s[3],
            }));
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracer_without_a_file_stays_bounded_and_the_trace_lines_up() {
        let mut t = Tracer::new(true, false);
        for i in 0..RECENT + 10 {
            t.span(|| format!("F{i}"), "forward", || ());
        }
        assert!(t.spans().len() <= RECENT);
        assert_eq!(t.spans().last().unwrap().name, format!("F{}", RECENT + 9));
        let mut all = Tracer::new(true, true);
        all.span(|| "B0".into(), "backward", || ());
        let trace = chrome_trace(&[("rank 0".into(), all.to_json())]);
        let events = trace["traceEvents"].as_array().unwrap();
        assert_eq!(events[1]["name"], "B0");
        assert_eq!(events[1]["ts"], 0.0, "times start at the earliest span");
    }
}
