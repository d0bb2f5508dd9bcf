//! `bootstrap`: the transport choice (pure), the ranks' agreement on it,
//! and whole jobs started with `init_with` by threads (a real TCP store on
//! 127.0.0.1) that run a collective, split, and shut down cleanly.

use std::thread;
use std::time::Duration;

use polychip_comm::CommError;
use polychip_comm::bootstrap::{InitOptions, TransportKind, agree, choose, init_with};
use polychip_comm::collectives::{DType, ReduceOp};
use polychip_comm::env::RankInfo;
use polychip_comm::launch::free_port;
use polychip_comm::verbs::RdmaAvailability;

fn info(rank: usize, world: usize, local_world: usize, port: u16) -> RankInfo {
    RankInfo {
        local_rank: rank % local_world,
        local_world_size: local_world,
        ..RankInfo::local(rank, world, port)
    }
}

fn no_rdma() -> RdmaAvailability {
    RdmaAvailability::Unavailable {
        reason: "RDMA unavailable: no RDMA devices found".into(),
    }
}

#[test]
fn auto_picks_shm_on_one_machine_else_rdma_or_tcp() {
    let one = info(1, 4, 4, 1);
    let (kind, why) = choose(None, &one, || panic!("not asked")).unwrap();
    assert_eq!(
        (kind, why.as_str()),
        (TransportKind::Shm, "all 4 ranks are on this machine")
    );
    let (kind, why) = choose(None, &info(1, 8, 4, 1), no_rdma).unwrap();
    assert_eq!(kind, TransportKind::Tcp);
    assert_eq!(
        why,
        "ranks span machines; RDMA unavailable: no RDMA devices found"
    );
    let rdma = || RdmaAvailability::Available {
        devices: vec!["mlx5_0".into()],
    };
    let (kind, _) = choose(None, &info(1, 8, 4, 1), rdma).unwrap();
    let want = if cfg!(feature = "verbs") {
        TransportKind::Verbs
    } else {
        TransportKind::Tcp
    };
    assert_eq!(kind, want);
    let e = choose(Some(TransportKind::Shm), &info(0, 8, 4, 1), no_rdma).unwrap_err();
    assert!(e.to_string().contains("span machines"), "{e}");
    let (kind, why) = choose(Some(TransportKind::Tcp), &one, no_rdma).unwrap();
    assert_eq!(
        (kind, why.as_str()),
        (TransportKind::Tcp, "requested by POLYCHIP_TRANSPORT")
    );
}

#[test]
fn transport_names_parse() {
    assert_eq!(TransportKind::parse(" AUTO ").unwrap(), None);
    assert_eq!(TransportKind::parse("").unwrap(), None);
    assert_eq!(
        TransportKind::parse("tcp").unwrap(),
        Some(TransportKind::Tcp)
    );
    assert_eq!(
        TransportKind::parse("verbs").unwrap(),
        Some(TransportKind::Verbs)
    );
    let e = TransportKind::parse("ucx").unwrap_err().to_string();
    assert!(e.contains("POLYCHIP_TRANSPORT=\"ucx\""), "{e}");
}

#[test]
fn ranks_agree_on_the_weakest_pick() {
    use TransportKind::{Shm, Tcp, Verbs};
    assert_eq!(agree(0, &[(Verbs, false), (Tcp, false)]).unwrap(), Tcp);
    assert_eq!(agree(0, &[(Shm, false), (Shm, false)]).unwrap(), Shm);
    assert_eq!(agree(0, &[(Tcp, true), (Tcp, false)]).unwrap(), Tcp);
    let e = agree(1, &[(Verbs, true), (Tcp, false)]).unwrap_err();
    assert!(matches!(e, CommError::Mismatch { rank: 1, .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("rank 0: verbs (requested), rank 1: tcp (auto)"),
        "{e}"
    );
}

/// Three thread ranks start a job over `transport`, all-reduce, split into
/// {0, 2} and {1}, and shut down cleanly.
fn job(transport: Option<TransportKind>, want: TransportKind) {
    let port = free_port().unwrap();
    let handles: Vec<_> = (0..3)
        .map(|r| {
            thread::spawn(move || {
                let mut options = InitOptions::from_env().unwrap();
                options.transport = transport;
                options.timeout = Duration::from_secs(20);
                let mut job = init_with(info(r, 3, 3, port), options).unwrap();
                assert_eq!(job.transport_choice().0, want);
                assert_eq!(job.transport().name(), want.name());
                let mut buf = (r as i64 + 1).to_ne_bytes().to_vec();
                job.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
                assert_eq!(i64::from_ne_bytes(buf[..].try_into().unwrap()), 6);
                let mut group = job.split((r % 2) as u32, 0).unwrap();
                let mut buf = (r as i64 + 1).to_ne_bytes().to_vec();
                group
                    .all_reduce(&mut buf, DType::I64, ReduceOp::Sum)
                    .unwrap();
                let got = i64::from_ne_bytes(buf[..].try_into().unwrap());
                assert_eq!(got, if r % 2 == 0 { 4 } else { 2 });
                // A peer may still be returning its last credits in the
                // group (over TCP a write to a closed peer fails): a
                // barrier on the parent first. The group holds the store:
                // drop it before the job.
                job.barrier().unwrap();
                drop(group);
                job.finish().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_job_over_auto_shm_starts_and_finishes() {
    job(None, TransportKind::Shm);
}

#[test]
fn a_job_over_tcp_starts_and_finishes() {
    job(Some(TransportKind::Tcp), TransportKind::Tcp);
}

#[test]
fn a_single_process_job_needs_no_launcher() {
    let mut options = InitOptions::from_env().unwrap();
    options.transport = None;
    let mut job = init_with(RankInfo::single(), options).unwrap();
    let mut buf = 5i32.to_ne_bytes().to_vec();
    job.all_reduce(&mut buf, DType::I32, ReduceOp::Max).unwrap();
    assert_eq!(buf, 5i32.to_ne_bytes());
    // Dropping shuts down too.
    drop(job);
}

#[test]
fn a_rank_given_twice_or_a_world_that_differs_is_refused_at_once() {
    // Ranks 0, 1 and a second process given rank 1: one of the two rank
    // 1s is refused at once, naming the rank; the other runs the job.
    // The job stays up until all three have their answer (the refused one
    // could otherwise arrive after the job had ended).
    let port = free_port().unwrap();
    let start = std::time::Instant::now();
    let all = std::sync::Arc::new(std::sync::Barrier::new(3));
    let handles: Vec<_> = [0usize, 1, 1]
        .into_iter()
        .map(|r| {
            let all = all.clone();
            thread::spawn(move || -> Result<(), String> {
                let mut options = InitOptions::from_env().unwrap();
                options.timeout = Duration::from_secs(20);
                let mut job = match init_with(info(r, 2, 2, port), options) {
                    Ok(job) => job,
                    Err(e) => {
                        all.wait();
                        return Err(e.to_string());
                    }
                };
                let mut buf = 1i64.to_ne_bytes().to_vec();
                job.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
                assert_eq!(i64::from_ne_bytes(buf[..].try_into().unwrap()), 2);
                all.wait();
                job.finish().unwrap();
                Ok(())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results[0].is_ok(), "{results:?}");
    let refused: Vec<&String> = results[1..]
        .iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert_eq!(refused.len(), 1, "{results:?}");
    // One sentence, without the run of spaces a lost line continuation
    // left in it.
    assert!(
        refused[0].contains("rank 1 joined the job twice")
            && refused[0].contains(") already has rank 1;"),
        "{}",
        refused[0]
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );

    // Rank 1 started with a world of 3 where rank 0 has 2: both refused
    // at once, naming the two sizes (they waited out the timeout).
    let port = free_port().unwrap();
    let start = std::time::Instant::now();
    let handles: Vec<_> = [(0usize, 2usize), (1, 3)]
        .into_iter()
        .map(|(r, world)| {
            thread::spawn(move || {
                let mut options = InitOptions::from_env().unwrap();
                options.timeout = Duration::from_secs(20);
                init_with(info(r, world, world, port), options)
                    .map(|_| ())
                    .unwrap_err()
                    .to_string()
            })
        })
        .collect();
    // The first to see the other's size says so; the other may find the
    // store gone with rank 0 before it reads rank 0's size.
    let messages: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let named =
        |m: &String| m.contains("world of") && m.contains("same world size") && !m.contains("  ");
    assert!(messages.iter().any(named), "{messages:?}");
    assert!(
        messages
            .iter()
            .all(|m| named(m) || m.contains("peer rank 0 is gone")),
        "{messages:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
}
