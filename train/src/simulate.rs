//! The simulator's view of a real run: the planner's discrete-event 1F1B
//! simulator fed with the stage times the run measured, so its trace lines
//! up with the real trace and its step time shows how much of the measured
//! step the schedule explains (the rest is transfers, reduction, optimizer
//! and noise).

use polychip_planner::schedule::{Schedule, StageTiming};
use polychip_planner::sim;
use serde_json::Value;

use crate::plan::TrainPlan;
use crate::trainer::Summary;

/// The first replica's schedule with the measured forward and backward
/// times (transfers, reduction and optimizer counted as zero).
pub fn measured_schedule(plan: &TrainPlan, s: &Summary) -> Schedule {
    let g = &plan.groups[0];
    let stages = s
        .stage_times
        .iter()
        .take(g.stages.len())
        .map(|(label, f, b)| StageTiming {
            name: label.clone(),
            forward: *f,
            backward: *b,
            send_next: 0.0,
            dp_allreduce: 0.0,
            optimizer: 0.0,
            sends_async: true,
        })
        .collect();
    Schedule {
        stages,
        microbatches: g.micro_batches,
    }
}

/// The simulated step time of [`measured_schedule`], seconds.
pub fn simulated_step_seconds(plan: &TrainPlan, s: &Summary) -> f64 {
    sim::simulate(&measured_schedule(plan, s)).step_time
}

/// A Chrome trace of [`measured_schedule`]'s simulated step.
pub fn simulated_trace(plan: &TrainPlan, s: &Summary) -> Value {
    let schedule = measured_schedule(plan, s);
    let names: Vec<String> = schedule.stages.iter().map(|t| t.name.clone()).collect();
    sim::chrome_trace(&sim::simulate(&schedule), &names)
}
