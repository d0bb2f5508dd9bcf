//! Tests of the pipeline simulator: textbook results for equal stages, its
//! measured relation to the analytic step time, the 1F1B order and the
//! dependencies read back from the events, edge cases, and the Chrome trace.

use polychip_planner::schedule::{PipelineSchedule, Schedule, StageTiming};
use polychip_planner::sim::{Event, EventKind, SimResult, chrome_trace, simulate};

const EPS: f64 = 1e-9;

/// Xorshift64: deterministic random schedules without a dependency.
struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn n(&mut self, lo: usize, hi: usize) -> usize {
        (lo + (self.f() * (hi - lo + 1) as f64) as usize).min(hi)
    }
}

fn st(f: f64, b: f64, send: f64) -> StageTiming {
    StageTiming {
        name: String::new(),
        forward: f,
        backward: b,
        send_next: send,
        dp_allreduce: 0.0,
        optimizer: 0.0,
        sends_async: false,
        weight_grad: 0.0,
    }
}

fn sched(stages: Vec<StageTiming>, m: usize) -> Schedule {
    let mut stages = stages;
    if let Some(last) = stages.last_mut() {
        last.send_next = 0.0;
    }
    Schedule {
        stages,
        microbatches: m,
        pipeline: Default::default(),
        virtual_stages: 1,
        run_ahead: 1,
    }
}

/// A random schedule: `p` stages, `m` micro-batches, sends up to `c`.
fn random(r: &mut Rng, p: usize, m: usize, c: f64, tail: bool) -> Schedule {
    let stages = (0..p)
        .map(|_| {
            let f = 0.1 + r.f();
            let mut s = st(f, f * (1.0 + 2.0 * r.f()), c * r.f());
            if tail {
                (s.dp_allreduce, s.optimizer) = (r.f(), 0.1 * r.f());
            }
            s
        })
        .collect();
    sched(stages, m)
}

fn compute(res: &SimResult, i: usize) -> Vec<&Event> {
    let kinds = [EventKind::Forward, EventKind::Backward];
    res.events
        .iter()
        .filter(|e| e.stage == i && kinds.contains(&e.kind))
        .collect()
}

fn end_of(res: &SimResult, stage: usize, kind: EventKind, j: usize) -> f64 {
    res.events
        .iter()
        .find(|e| e.stage == stage && e.kind == kind && e.microbatch == Some(j))
        .unwrap()
        .end
}

#[test]
fn equal_stages_give_the_textbook_step_and_bubble() {
    for p in 1..=6 {
        for m in 1..=12 {
            let res = simulate(&sched((0..p).map(|_| st(0.25, 0.5, 0.0)).collect(), m));
            let want = (m + p - 1) as f64 * 0.75;
            assert!(
                (res.step_time - want).abs() < EPS,
                "p{p} m{m}: {} vs {want}",
                res.step_time
            );
            let bubble = (p - 1) as f64 / (m + p - 1) as f64;
            assert!((res.bubble_fraction - bubble).abs() < EPS);
            assert!(
                res.stage_busy
                    .iter()
                    .all(|&b| (b - m as f64 * 0.75).abs() < EPS)
            );
        }
    }
}

#[test]
fn equal_stages_with_transfers_exceed_the_analytic_time_by_their_blocked_sends() {
    // The analytic formula counts one micro-batch's round trip of sends; the
    // simulator also blocks each sender on its transfer (as Megatron and
    // DeepSpeed do), and 1F1B's bounded in-flight window exposes part of the
    // round trip in the steady state. Measured: the excess stays within two
    // sends per micro-batch per stage, sim - analytic <= 2 c (m + p).
    let mut worst = 0.0f64;
    for p in 2..=6 {
        for m in 1..=16 {
            for c in [0.01, 0.1, 0.5] {
                let s = sched((0..p).map(|_| st(1.0, 2.0, c)).collect(), m);
                let (sim, an) = (simulate(&s).step_time, s.analytic_step_time());
                assert!(sim >= an - EPS, "p{p} m{m} c{c}: {sim} < {an}");
                let bound = 2.0 * c * (m + p) as f64;
                assert!(sim - an <= bound + EPS, "p{p} m{m} c{c}: {sim} vs {an}");
                worst = worst.max((sim - an) / bound);
            }
        }
    }
    println!("largest excess over the bound's 2 c (m + p): {worst:.3} of it");
}

#[test]
fn unequal_stages_versus_the_analytic_time() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut lo, mut hi, mut lo_c, mut hi_c) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for _ in 0..20_000 {
        let p = r.n(1, 8);
        let m = r.n(p, 4 * p);
        for c in [0.0, 0.2] {
            let s = random(&mut r, p, m, c, false);
            let (sim, an) = (simulate(&s).step_time, s.analytic_step_time());
            let d = (sim - an) / an;
            // Lower bounds any schedule obeys: the slowest stage's compute,
            // and one micro-batch's round trip through the pipeline.
            let t: Vec<f64> = s.stages.iter().map(|x| x.forward + x.backward).collect();
            let p2p: f64 = 2.0 * s.stages.iter().map(|x| x.send_next).sum::<f64>();
            assert!(sim >= m as f64 * t.iter().cloned().fold(0.0, f64::max) - EPS);
            assert!(sim >= t.iter().sum::<f64>() + p2p - EPS);
            if c == 0.0 {
                (lo, hi) = (lo.min(d), hi.max(d));
            } else {
                (lo_c, hi_c) = (lo_c.min(d), hi_c.max(d));
            }
        }
    }
    println!("m >= p, no transfers: (sim - analytic) / analytic in [{lo:.4}, {hi:.4}]");
    println!("m >= p, sends <= 0.2: (sim - analytic) / analytic in [{lo_c:.4}, {hi_c:.4}]");
    assert!(hi < 0.01 && lo > -0.3, "no transfers: [{lo}, {hi}]");
}

#[test]
fn a_dominant_slowest_stage_keeps_the_simulation_under_the_analytic_time() {
    // Without transfers, when one stage is slowest in both forward and
    // backward (anywhere in the pipeline), sim <= analytic.
    let mut r = Rng(777);
    for _ in 0..20_000 {
        let p = r.n(2, 6);
        let m = r.n(1, 3 * p);
        let mut s = random(&mut r, p, m, 0.0, false);
        let k = r.n(0, p - 1);
        (s.stages[k].forward, s.stages[k].backward) = (1.2, 3.1);
        assert!(simulate(&s).step_time <= s.analytic_step_time() + EPS);
    }
}

#[test]
fn a_non_dominant_slowest_stage_can_exceed_the_analytic_time() {
    // Stage 1 is slowest overall (t = 6) but stage 0 has the slowest forward:
    // 1F1B's fixed order stalls, 53 against the analytic 51.
    let s = sched(
        vec![
            st(4.0, 1.0, 0.0),
            st(1.0, 5.0, 0.0),
            st(1.0, 1.0, 0.0),
            st(1.0, 1.0, 0.0),
        ],
        7,
    );
    assert_eq!(s.analytic_step_time(), 51.0);
    assert!((simulate(&s).step_time - 53.0).abs() < EPS);
}

/// Checks `res` is `s`'s timeline: every stage runs its 1F1B order, each
/// operation starting as soon as its stage and its input allow (the
/// input's transfer event has ended); a blocking stage holds for each
/// transfer it sends, an asynchronous one is free at once and sends its
/// transfers one after another; every transfer lasts its link's time; the
/// all-reduce and optimizer follow; the step ends with the last of them.
fn check_timeline(s: &Schedule, res: &SimResult) {
    let (p, m) = (s.stages.len(), s.microbatches.max(1));
    let transfer = |kind: EventKind, stage: usize, j: usize| {
        res.events
            .iter()
            .find(|e| e.kind == kind && e.stage == stage && e.microbatch == Some(j))
            .unwrap()
    };
    let mut step = 0.0f64;
    let (mut reduced, mut updates) = (0.0f64, Vec::new());
    for i in 0..p {
        let ev = compute(res, i);
        assert_eq!(ev.len(), 2 * m);
        let warm = (p - i).min(m);
        let (mut inflight, mut nf, mut nb, mut free) = (0usize, 0usize, 0usize, 0.0f64);
        for (k, e) in ev.iter().enumerate() {
            let j = e.microbatch.unwrap();
            let ready = if e.kind == EventKind::Forward {
                assert_eq!(j, nf);
                (nf, inflight) = (nf + 1, inflight + 1);
                match i {
                    0 => 0.0,
                    _ => transfer(EventKind::SendActivation, i - 1, j).end,
                }
            } else {
                assert_eq!(j, nb);
                (nb, inflight) = (nb + 1, inflight - 1);
                match i + 1 == p {
                    true => end_of(res, i, EventKind::Forward, j),
                    false => transfer(EventKind::SendGradient, i + 1, j).end,
                }
            };
            assert!(inflight <= warm, "stage {i} holds {inflight} > {warm}");
            // 1F1B order: `warm` forwards, then B/F alternating, then Bs.
            let fwd = k < warm || (k - warm) % 2 == 1 && k < 2 * m - warm;
            assert_eq!(e.kind == EventKind::Forward, fwd, "stage {i} op {k}");
            // No overlap, and it starts as soon as both stage and input allow.
            assert!(e.start >= free - EPS && e.start >= ready - EPS);
            assert!(
                (e.start - free.max(ready)).abs() < EPS,
                "stage {i} idles needlessly"
            );
            // A blocking stage waits for the transfer its operation sends.
            let send = match e.kind {
                EventKind::Forward if i + 1 < p => s.stages[i].send_next,
                EventKind::Backward if i > 0 => s.stages[i - 1].send_next,
                _ => 0.0,
            };
            free = e.end + if s.stages[i].sends_async { 0.0 } else { send };
        }
        let upd: Vec<&Event> = res
            .events
            .iter()
            .filter(|e| e.stage == i && !e.kind.is_transfer() && e.microbatch.is_none())
            .collect();
        assert_eq!(upd.len(), 2);
        // The all-reduce right after the stage's last pass; the optimizer
        // steps together once every stage has reduced (checked below).
        assert!((upd[0].start - free).abs() < EPS && upd[1].start >= upd[0].end - EPS);
        assert!((upd[1].end - upd[1].start - s.stages[i].optimizer).abs() < EPS);
        reduced = reduced.max(upd[0].end);
        updates.push(upd[1].start);
        step = step.max(upd[1].end);
        // Stage i's transfers, in the order it produced them: each starts
        // when its operation ends (and, asynchronous, when the one before
        // has arrived), and lasts its link's time.
        let mut sender_free = 0.0f64;
        for e in res
            .events
            .iter()
            .filter(|e| e.stage == i && e.kind.is_transfer())
        {
            let (kind, link) = match e.kind {
                EventKind::SendActivation => (EventKind::Forward, e.stage),
                _ => (EventKind::Backward, e.stage - 1),
            };
            let produced = end_of(res, e.stage, kind, e.microbatch.unwrap());
            let start = match s.stages[i].sends_async {
                true => produced.max(sender_free),
                false => produced,
            };
            assert!(
                (e.start - start).abs() < EPS,
                "stage {i}: {e:?} should start at {start}"
            );
            assert!((e.end - e.start - s.stages[link].send_next).abs() < EPS);
            sender_free = e.end;
        }
    }
    assert!(
        updates.iter().all(|&u| (u - reduced).abs() < EPS),
        "{updates:?}"
    );
    assert!((res.step_time - step).abs() < EPS);
}

#[test]
fn events_follow_1f1b_and_respect_every_dependency_with_blocking_or_queued_sends() {
    let mut r = Rng(42);
    for _ in 0..2_000 {
        let p = r.n(1, 7);
        let m = r.n(1, 12);
        let s = random(&mut r, p, m, 0.3, true);
        let blocking = simulate(&s);
        check_timeline(&s, &blocking);
        // On a sender thread: the same rules, and never slower.
        let queued = simulate(&asynchronous(&s));
        check_timeline(&asynchronous(&s), &queued);
        assert!(
            queued.step_time <= blocking.step_time + EPS,
            "p{p} m{m}: {} > {}",
            queued.step_time,
            blocking.step_time
        );
        // Free transfers: nothing for the sender to hide.
        let mut free = s.clone();
        for st in &mut free.stages {
            st.send_next = 0.0;
        }
        let (a, b) = (simulate(&free), simulate(&asynchronous(&free)));
        assert!((a.step_time - b.step_time).abs() < EPS);
    }
}

#[test]
fn single_stage_and_single_microbatch() {
    // p = 1: m forward/backward pairs back to back, then the tail.
    let mut one = st(1.0, 2.0, 0.7);
    (one.dp_allreduce, one.optimizer) = (0.5, 0.25);
    let res = simulate(&sched(vec![one], 5));
    assert!((res.step_time - (5.0 * 3.0 + 0.75)).abs() < EPS);
    assert!((res.bubble_fraction - 0.75 / 15.75).abs() < EPS);
    assert!(res.events.iter().all(|e| !e.kind.is_transfer()));
    // m = 1: one round trip; m = 0 is treated as 1, as the analytic time does.
    let stages = vec![st(1.0, 2.0, 0.5), st(2.0, 3.0, 0.25), st(0.5, 1.0, 0.0)];
    for m in [0, 1] {
        let s = sched(stages.clone(), m);
        let res = simulate(&s);
        assert!((res.step_time - (9.5 + 1.5)).abs() < EPS);
        assert!((res.step_time - s.analytic_step_time()).abs() < EPS);
    }
    // No stages: an empty step.
    let res = simulate(&sched(vec![], 4));
    assert_eq!(
        (res.step_time, res.events.len(), res.bubble_fraction),
        (0.0, 0, 0.0)
    );
}

#[test]
fn chrome_trace_has_one_row_per_stage_and_one_x_per_event() {
    let s = random(&mut Rng(5), 3, 6, 0.2, true);
    let res = simulate(&s);
    let names: Vec<String> = (0..3).map(|i| format!("stage {i} (H100 x8)")).collect();
    let trace = chrome_trace(&res, &names);
    let evs = trace["traceEvents"].as_array().unwrap();
    let xs: Vec<_> = evs.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(xs.len(), res.events.len());
    assert_eq!(
        res.events.iter().filter(|e| e.kind.is_transfer()).count(),
        2 * 6 * 2
    );
    let thread = |tid: u64| {
        evs.iter()
            .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == tid)
            .map(|e| e["args"]["name"].as_str().unwrap().to_string())
    };
    for (i, n) in names.iter().enumerate() {
        assert_eq!(thread(i as u64).as_deref(), Some(n.as_str()));
    }
    for x in &xs {
        assert_eq!(x["pid"], 0);
        assert!(thread(x["tid"].as_u64().unwrap()).is_some_and(|n| !n.is_empty()));
        assert!(x["ts"].as_f64().unwrap() >= 0.0 && x["dur"].as_f64().unwrap() >= 0.0);
        assert!(
            x["name"].is_string() && x["cat"].is_string() && x["args"].get("microbatch").is_some()
        );
    }
    let f0 = xs
        .iter()
        .find(|x| x["name"] == "forward 0" && x["tid"] == 1)
        .unwrap();
    let e = res
        .events
        .iter()
        .find(|e| e.stage == 1 && e.kind == EventKind::Forward)
        .unwrap();
    assert!((f0["ts"].as_f64().unwrap() - e.start * 1e6).abs() < 1e-3);
    assert_eq!(f0["args"]["microbatch"], 0);
    assert!(
        serde_json::to_string(&trace)
            .unwrap()
            .contains("traceEvents")
    );
}

/// The same schedule with every stage's sends on a sender thread.
fn asynchronous(s: &Schedule) -> Schedule {
    let mut s = s.clone();
    for st in &mut s.stages {
        st.sends_async = true;
    }
    s
}

#[test]
fn asynchronous_sends_free_the_stage_and_go_one_after_another() {
    // Four stages whose transfers cost half a forward: blocking, each send
    // holds its stage (the warm-up forwards and the last stage's backward
    // passes wait for them); on a sender thread, the stage goes on.
    let s = sched((0..4).map(|_| st(1.0, 2.0, 0.5)).collect(), 8);
    let (blocking, queued) = (simulate(&s), simulate(&asynchronous(&s)));
    assert!(
        queued.step_time < blocking.step_time - 1.0,
        "{} vs {}",
        queued.step_time,
        blocking.step_time
    );
    // The first stage's compute overlaps its own transfers, and those never
    // overlap each other.
    let sends: Vec<&Event> = queued
        .events
        .iter()
        .filter(|e| e.stage == 0 && e.kind.is_transfer())
        .collect();
    assert!(sends.windows(2).all(|w| w[1].start >= w[0].end - EPS));
    let overlapped = compute(&queued, 0).iter().any(|c| {
        sends
            .iter()
            .any(|t| c.start < t.end - EPS && t.start < c.end - EPS)
    });
    assert!(overlapped, "no compute ran while a send was in flight");
}

/// The same schedule under the zero-bubble schedule, each stage's weights'
/// gradients a share `w` of its backward pass.
fn zero_bubble(s: &Schedule, w: f64) -> Schedule {
    let mut s = asynchronous(s);
    s.pipeline = PipelineSchedule::ZeroBubble;
    for st in &mut s.stages {
        st.weight_grad = w * st.backward;
    }
    s
}

#[test]
fn zero_bubble_worked_case() {
    // Two stages of F = 1 and a backward pass of 2 (1 of it the weights'),
    // four micro-batches, free transfers. 1F1B: (m + p - 1) 3 = 15. Zero
    // bubble: stage 1 runs F0 B0 W0 F1 B1 W1 ..., sending each gradient
    // after its B (2-3, 5-6, 8-9, 11-12); stage 0 runs F0 F1 F2 ahead
    // (0-3), B0 3-5, F3 5-6, B1 6-8, B2 9-11, B3 12-14: 14.
    let s = sched(vec![st(1.0, 2.0, 0.0), st(1.0, 2.0, 0.0)], 4);
    assert!((simulate(&asynchronous(&s)).step_time - 15.0).abs() < EPS);
    let zb = simulate(&zero_bubble(&s, 0.5));
    assert!((zb.step_time - 14.0).abs() < EPS, "{}", zb.step_time);
    let weights: Vec<(usize, f64, f64)> = zb
        .events
        .iter()
        .filter(|e| e.kind == EventKind::WeightGrad)
        .map(|e| (e.stage, e.start, e.end))
        .collect();
    // Only the stage that sends gradients splits its backward passes.
    assert_eq!(
        weights,
        vec![
            (1, 3.0, 4.0),
            (1, 6.0, 7.0),
            (1, 9.0, 10.0),
            (1, 12.0, 13.0)
        ]
    );
}

#[test]
fn zero_bubble_events_keep_its_order_and_every_dependency() {
    let mut r = Rng(2024);
    let mut gains = Vec::new();
    for _ in 0..2_000 {
        let p = r.n(1, 6);
        let m = r.n(1, 12);
        let share = 0.5 * r.f();
        let one = asynchronous(&random(&mut r, p, m, 0.3, true));
        let s = zero_bubble(&one, share);
        let res = simulate(&s);
        let event = |stage: usize, kind: EventKind, j: usize| {
            res.events
                .iter()
                .find(|e| e.stage == stage && e.kind == kind && e.microbatch == Some(j))
                .unwrap_or_else(|| panic!("no {kind:?} {j} on stage {stage}"))
        };
        for i in 0..p {
            // The order: min(2 (p - i) - 1, m) forwards, then backward
            // (and, on a stage that sends gradients, weights) and forward
            // alternating.
            let warm = (2 * (p - i) - 1).min(m);
            let split = i > 0;
            let mut want = Vec::new();
            want.extend((0..warm).map(|j| (EventKind::Forward, j)));
            for k in 0..m {
                want.push((EventKind::Backward, k));
                if split {
                    want.push((EventKind::WeightGrad, k));
                }
                if warm + k < m {
                    want.push((EventKind::Forward, warm + k));
                }
            }
            let ops: Vec<&Event> = res
                .events
                .iter()
                .filter(|e| e.stage == i && !e.kind.is_transfer() && e.microbatch.is_some())
                .collect();
            let got: Vec<(EventKind, usize)> = ops
                .iter()
                .map(|e| (e.kind, e.microbatch.unwrap()))
                .collect();
            assert_eq!(got, want, "stage {i} of {p}, m {m}");
            let mut free = 0.0f64;
            for e in &ops {
                let j = e.microbatch.unwrap();
                let t = &s.stages[i];
                let (ready, dur) = match e.kind {
                    EventKind::Forward if i == 0 => (0.0, t.forward),
                    EventKind::Forward => {
                        (event(i - 1, EventKind::SendActivation, j).end, t.forward)
                    }
                    EventKind::Backward => {
                        let ready = match i + 1 == p {
                            true => event(i, EventKind::Forward, j).end,
                            false => event(i + 1, EventKind::SendGradient, j).end,
                        };
                        let w = if split { t.weight_grad } else { 0.0 };
                        (ready, t.backward - w)
                    }
                    _ => (0.0, t.weight_grad),
                };
                assert!((e.start - free.max(ready)).abs() < EPS, "stage {i}: {e:?}");
                assert!((e.end - e.start - dur).abs() < EPS);
                free = e.end;
                // The gradient leaves as soon as the input's part is done,
                // before the weights' part.
                if e.kind == EventKind::Backward && i > 0 {
                    assert!(event(i, EventKind::SendGradient, j).start >= e.end - EPS);
                    let w = event(i, EventKind::WeightGrad, j);
                    assert!((w.start - e.end).abs() < EPS);
                }
            }
        }
        gains.push(simulate(&one).step_time / res.step_time);
    }
    gains.sort_by(f64::total_cmp);
    println!(
        "1F1B over zero-bubble step, 2,000 random schedules: min {:.3}, median {:.3}, max {:.3}",
        gains[0],
        gains[gains.len() / 2],
        gains[gains.len() - 1]
    );
}

/// An interleaved schedule: `p` devices of `v` chunks, the chunks' timings
/// given in model order.
fn interleaved(chunks: Vec<StageTiming>, v: usize, m: usize) -> Schedule {
    let mut s = sched(chunks, m);
    s.virtual_stages = v;
    s
}

#[test]
fn interleaving_shrinks_the_bubble_by_the_chunks_per_device() {
    // p devices of equal work t per micro-batch, split into v chunks: the
    // step is (m + (p - 1) / v) t (Narayanan et al., 2021), and the
    // analytic formula agrees.
    for (p, v, m) in [
        (4usize, 2usize, 8usize),
        (4, 4, 16),
        (2, 3, 6),
        (3, 2, 3),
        (8, 2, 16),
    ] {
        let t = 1.0;
        let chunk = st(t / v as f64 / 3.0, 2.0 * t / v as f64 / 3.0, 0.0);
        let s = interleaved(vec![chunk; p * v], v, m);
        polychip_planner::sim::check(&s).unwrap();
        let want = (m as f64 + (p - 1) as f64 / v as f64) * t;
        let got = simulate(&s).step_time;
        assert!(
            (got - want).abs() < EPS,
            "p {p} v {v} m {m}: {got} vs {want}"
        );
        assert!(
            (s.analytic_step_time() - want).abs() < EPS,
            "p {p} v {v} m {m}"
        );
        // One chunk per device is the non-interleaved step.
        let plain = sched(vec![st(t / 3.0, 2.0 * t / 3.0, 0.0); p], m);
        let plain_time = simulate(&plain).step_time;
        assert!((plain_time - (m + p - 1) as f64 * t).abs() < EPS);
        assert!(got < plain_time || p == 1);
    }
}

#[test]
fn interleaved_devices_run_every_chunk_pass_once_in_dependency_order() {
    let mut r = Rng(0x1f1b_2021);
    for _ in 0..200 {
        let p = r.n(2, 6);
        let v = r.n(2, 4);
        let m = p * r.n(1, 4);
        let mut chunks: Vec<StageTiming> = (0..p * v)
            .map(|_| {
                let f = 0.1 + r.f();
                st(f, f * (1.0 + 2.0 * r.f()), 0.3 * r.f())
            })
            .collect();
        let async_sends = r.f() < 0.5;
        for c in &mut chunks {
            c.sends_async = async_sends;
            (c.dp_allreduce, c.optimizer) = (0.1 * r.f(), 0.01 * r.f());
        }
        let s = interleaved(chunks, v, m);
        let res = simulate(&s);
        let n = p * v;
        for k in 0..n {
            // Every chunk runs each micro-batch's forward and backward once.
            let c = compute(&res, k);
            assert_eq!(c.len(), 2 * m, "p {p} v {v} m {m} chunk {k}");
            for j in 0..m {
                let f = end_of(&res, k, EventKind::Forward, j);
                let b = end_of(&res, k, EventKind::Backward, j);
                assert!(f <= b + EPS);
                if k > 0 {
                    // After the previous chunk's forward and its transfer.
                    let prev = end_of(&res, k - 1, EventKind::Forward, j);
                    let arrived = prev + s.stages[k - 1].send_next;
                    let start = c
                        .iter()
                        .find(|e| e.kind == EventKind::Forward && e.microbatch == Some(j))
                        .unwrap()
                        .start;
                    assert!(start + EPS >= arrived, "chunk {k} mb {j}");
                }
            }
        }
        // A device's passes never overlap.
        for i in 0..p {
            let mut busy: Vec<(f64, f64)> = res
                .events
                .iter()
                .filter(|e| !e.kind.is_transfer() && e.stage % p == i)
                .filter(|e| matches!(e.kind, EventKind::Forward | EventKind::Backward))
                .map(|e| (e.start, e.end))
                .collect();
            busy.sort_by(|a, b| a.0.total_cmp(&b.0));
            for w in busy.windows(2) {
                assert!(w[0].1 <= w[1].0 + EPS, "device {i} overlaps: {w:?}");
            }
        }
        // Work conservation: the step is at least the busiest device's
        // passes, and the simulator's busy time is per device.
        assert_eq!(res.stage_busy.len(), p);
        let most = res.stage_busy.iter().cloned().fold(0.0, f64::max);
        assert!(res.step_time + EPS >= most);
        let trace = chrome_trace(&res, &[]);
        let events = trace["traceEvents"].as_array().unwrap().len();
        assert!(events >= 2 * n * m + 2 * (n - 1) * m + 2 * p, "{events}");
    }
}

#[test]
fn interleaving_is_refused_where_it_cannot_run() {
    use polychip_planner::sim::check;
    let chunk = st(1.0, 2.0, 0.0);
    // Micro-batches not a multiple of the devices.
    let err = check(&interleaved(vec![chunk.clone(); 8], 2, 6)).unwrap_err();
    assert!(err.contains("multiple of 4"), "{err}");
    // Chunks not a multiple of v, or one device.
    assert!(check(&interleaved(vec![chunk.clone(); 7], 2, 4)).is_err());
    assert!(check(&interleaved(vec![chunk.clone(); 2], 2, 4)).is_err());
    let mut zb = interleaved(vec![chunk; 8], 2, 8);
    zb.pipeline = PipelineSchedule::ZeroBubble;
    assert!(check(&zb).unwrap_err().contains("zero-bubble"));
}

/// Running ahead (`Schedule::run_ahead`) with fixed pass times, over
/// random pipelines of two to five stages on queued sends (the trainer
/// refuses it with blocking ones): never a longer step with two stages
/// (the first stage's extra forward passes come before backward passes
/// that wait on the last stage anyway), at times a shorter one; with more
/// a stage running ahead can delay a backward pass its neighbour waits
/// for, so the step moves either way (`-- --nocapture` prints the spread;
/// `--plan auto` runs ahead only where the simulated step is no longer).
#[test]
fn running_ahead_with_fixed_pass_times() {
    let mut r = Rng(77);
    for p in 2..=5 {
        let mut ratios = Vec::new();
        for _ in 0..500 {
            let m = r.n(1, 24);
            let (tail, c) = (r.f() < 0.5, 0.3 * r.f());
            let mut s = asynchronous(&random(&mut r, p, m, c, tail));
            let base = simulate(&s).step_time;
            s.run_ahead = 1 + r.n(1, 8);
            ratios.push(simulate(&s).step_time / base);
        }
        ratios.sort_by(f64::total_cmp);
        let q = |x: f64| ratios[((ratios.len() - 1) as f64 * x) as usize];
        assert!(ratios.iter().all(|r| r.is_finite() && *r > 0.0));
        if p == 2 {
            assert!(q(1.0) <= 1.0 + EPS, "two stages, longer by {}", q(1.0));
        }
        println!(
            "{p} stages: run-ahead step over 1F1B's: min {:.4} p1 {:.4} median {:.4} p99 {:.4} max {:.4}",
            q(0.0),
            q(0.01),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
}
