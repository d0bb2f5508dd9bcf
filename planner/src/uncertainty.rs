//! Choosing a layout when the measured costs are uncertain.
//!
//! A measured search ([`crate::measured`]) prices each layout from one
//! profile of each device kind. A profile is a sample: on a shared machine
//! the same run measures 10% apart from one start to the next
//! (docs/performance.md), and a profile taken in a slow or a fast moment
//! for one kind misjudges the ratio between kinds, which is what the layout
//! hinges on. Taking the layout whose nominal step is lowest then favours
//! the layouts the errors flattered (the winner's curse): a pipeline that
//! gives the slow chip just enough work to balance the fast one, or a deal
//! that gives it just enough sequences, is the best on paper and the first
//! to lose when the slow chip runs 10% slower than profiled, while a layout
//! with slack on the slow chip loses only what the bottleneck's own error
//! costs. Twice at stop 29 `--plan auto` chose such a layout on this
//! machine: the Cobalt stage ran 68.19% efficient against 93.64% for the
//! other schedule's layout, and another step came 66% over its prediction
//! (docs/performance.md, "The zero-bubble schedule").
//!
//! So the search scores each layout by its expected step when every device
//! kind's costs may be off by a relative standard error `sigma`,
//! independently from kind to kind (devices of one kind share a profile,
//! and so its error). The expectation is taken at the unscented transform's
//! sigma points: for `k` kinds, each kind in turn scaled by `1 +/- sqrt(k)
//! sigma` with the others as measured, `2 k` evaluations averaged. That is
//! exact for a step that is linear in the costs, and for a step that is the
//! larger of two stages (a balanced pipeline, a balanced deal) it adds
//! `sigma / sqrt 2` of the step against the exact `sigma / sqrt pi`: the
//! penalty of a knife edge, where the layout with slack pays none. The
//! nominal step stays the prediction.
//!
//! A step time built from sums and maxima of the costs (a longest path
//! through the schedule's events) is convex and homogeneous in them, so the
//! expectation is at least the nominal step, and the layout of the lowest
//! nominal step `t` expects at most `t (1 + sqrt(k) sigma / 2)`:
//! [`SigmaPoints::window`] bounds the layouts worth scoring.

/// The largest relative error accepted: scaling a kind by `1 - sqrt(k)
/// sigma` must leave its costs positive.
pub const MAX_SIGMA: f64 = 0.5;

/// The sigma points of a set of devices: each a factor per device.
#[derive(Debug, Clone, PartialEq)]
pub struct SigmaPoints {
    points: Vec<Vec<f64>>,
    spread: f64,
}

/// A device's kind: its name up to the `:` (`cobalt:1` is a `cobalt`), or
/// the whole name.
pub fn kind(name: &str) -> &str {
    name.split_once(':').map_or(name, |(k, _)| k)
}

impl SigmaPoints {
    /// The points for devices named `names` (in the search's order) whose
    /// kinds' costs each have relative standard error `sigma` (clamped to
    /// `[0, MAX_SIGMA]`). None when there is nothing to average: `sigma`
    /// is 0, or every device is of one kind (scaling all of them scales
    /// every layout's step alike).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>, sigma: f64) -> SigmaPoints {
        let names: Vec<&str> = names.into_iter().collect();
        let mut kinds: Vec<&str> = Vec::new();
        for n in &names {
            if !kinds.contains(&kind(n)) {
                kinds.push(kind(n));
            }
        }
        let sigma = if sigma.is_finite() {
            sigma.clamp(0.0, MAX_SIGMA)
        } else {
            0.0
        };
        let k = kinds.len();
        // Keep every factor above 0.1 whatever the number of kinds.
        let spread = ((k as f64).sqrt() * sigma).min(0.9);
        let mut points = Vec::new();
        if k >= 2 && spread > 0.0 {
            for kd in &kinds {
                for sign in [1.0, -1.0] {
                    points.push(
                        names
                            .iter()
                            .map(|n| match kind(n) == *kd {
                                true => 1.0 + sign * spread,
                                false => 1.0,
                            })
                            .collect(),
                    );
                }
            }
        }
        SigmaPoints { points, spread }
    }

    /// Whether scoring is the nominal step.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The points: one factor per device each.
    pub fn points(&self) -> &[Vec<f64>] {
        &self.points
    }

    /// The nominal step above which a layout cannot expect less than the
    /// layout of nominal step `best` (see the module's note).
    pub fn window(&self, best: f64) -> f64 {
        match self.is_empty() {
            true => best,
            false => best * (1.0 + self.spread / 2.0),
        }
    }

    /// The expected step: `step(factors)` averaged over the points, or
    /// `nominal` without points.
    pub fn expected(&self, nominal: f64, step: impl Fn(&[f64]) -> f64) -> f64 {
        match self.is_empty() {
            true => nominal,
            false => self.points.iter().map(|p| step(p)).sum::<f64>() / self.points.len() as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knife_edge_pays_and_slack_does_not() {
        let s = SigmaPoints::new(["ferrite:0", "cobalt:0", "ferrite:1"], 0.1);
        // Two kinds, four points; devices of a kind move together.
        assert_eq!(s.points().len(), 4);
        let r = 2f64.sqrt() * 0.1;
        assert_eq!(s.points()[0], vec![1.0 + r, 1.0, 1.0 + r]);
        assert_eq!(s.points()[3], vec![1.0, 1.0 - r, 1.0]);
        // Two devices each bounding the step at 1: it expects 1 + r / 2.
        let balanced = s.expected(1.0, |f| f[0].max(f[1]));
        assert!((balanced - (1.0 + r / 2.0)).abs() < 1e-12, "{balanced}");
        // The first bounds it with the second at 0.8: linear, no penalty.
        let slack = s.expected(1.0, |f| f[0].max(0.8 * f[1]));
        assert!((slack - 1.0).abs() < 1e-12, "{slack}");
        // Within the window of the best nominal step.
        assert!(balanced <= s.window(1.0) + 1e-12);
    }

    #[test]
    fn one_kind_or_no_error_is_the_nominal_step() {
        for s in [
            SigmaPoints::new(["a:0", "a:1"], 0.1),
            SigmaPoints::new(["a:0", "b:0"], 0.0),
            SigmaPoints::new(["a:0", "b:0"], f64::NAN),
            SigmaPoints::new(["a:0", "b:0"], -1.0),
        ] {
            assert!(s.is_empty());
            assert_eq!(s.expected(2.5, |_| unreachable!()), 2.5);
            assert_eq!(s.window(2.5), 2.5);
        }
        // Clamped: every factor stays positive.
        let s = SigmaPoints::new(["a", "b", "c", "d"], 10.0);
        assert!(s.points().iter().flatten().all(|&f| f >= 0.1 - 1e-12));
        assert_eq!(kind("cobalt:1"), "cobalt");
        assert_eq!(kind("slow"), "slow");
    }
}
