//! The simulator's view of a real run: the planner's discrete-event
//! pipeline simulator fed with the stage times the run measured, so its trace lines
//! up with the real trace and its step time shows how much of the measured
//! step the schedule explains: the passes, and after them each stage's
//! measured wait for the gradient reduction and its optimizer step (the
//! rest is transfers, unequal micro-batches and noise).

use polychip_planner::schedule::{Schedule, StageTiming};
use polychip_planner::sim;
use serde_json::Value;

use crate::plan::TrainPlan;
use crate::trainer::Summary;

/// The first replica's schedule with the measured forward and backward
/// times per micro-batch and each stage's measured reduction wait and
/// optimizer step (transfers counted as zero).
pub fn measured_schedule(plan: &TrainPlan, s: &Summary) -> Schedule {
    let g = &plan.groups[0];
    let stages = s
        .stage_times
        .iter()
        .take(g.stages.len())
        .map(|t| StageTiming {
            name: t.label.clone(),
            forward: t.forward,
            backward: t.backward,
            send_next: 0.0,
            dp_allreduce: t.reduction,
            optimizer: t.optimizer,
            sends_async: true,
            weight_grad: t.weight_grad,
        })
        .collect();
    Schedule {
        stages,
        microbatches: g.micro_batches,
        pipeline: s.schedule,
        virtual_stages: 1,
        run_ahead: s.run_ahead.max(1),
    }
}

/// The simulated step of [`measured_schedule`]: its time in seconds, and
/// its Chrome trace.
pub fn simulated(plan: &TrainPlan, s: &Summary) -> (f64, Value) {
    let schedule = measured_schedule(plan, s);
    let names: Vec<String> = schedule.stages.iter().map(|t| t.name.clone()).collect();
    let result = sim::simulate(&schedule);
    (result.step_time, sim::chrome_trace(&result, &names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::StageTimes;

    #[test]
    fn the_simulated_step_adds_the_measured_reduction_wait_and_optimizer() {
        // One stage, 4 micro-batches of 1 + 2 ms, a 3 ms wait for the
        // reduction and a 5 ms optimizer step.
        let plan = TrainPlan::single("ferrite:0", 4, 2, 4);
        let summary = Summary {
            stage_times: vec![StageTimes {
                label: "rank 0".into(),
                forward: 1e-3,
                backward: 2e-3,
                reduction: 3e-3,
                optimizer: 5e-3,
                ..StageTimes::default()
            }],
            ..Summary::default()
        };
        let (step, _) = simulated(&plan, &summary);
        assert!((step - (4.0 * 3e-3 + 3e-3 + 5e-3)).abs() < 1e-12, "{step}");
    }
}
