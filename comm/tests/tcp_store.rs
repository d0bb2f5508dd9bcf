//! The TCP rendezvous store with threads as ranks on 127.0.0.1: rank 0
//! serves on a port the OS picks, the others connect to it.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use polychip_comm::CommError;
use polychip_comm::auth::JobAuth;
use polychip_comm::env::RankInfo;
use polychip_comm::store::Store;
use polychip_comm::tcp_store::{TcpStore, barrier};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Rank 0's store (and server) plus `world - 1` clients.
fn job(world: usize) -> (TcpStore, Vec<TcpStore>) {
    let server = TcpStore::connect(&RankInfo::local(0, world, 0), TIMEOUT).unwrap();
    let port = server.port();
    assert_ne!(port, 0);
    let clients = (1..world)
        .map(|r| TcpStore::connect(&RankInfo::local(r, world, port), TIMEOUT).unwrap())
        .collect();
    (server, clients)
}

#[test]
fn set_get_add_across_ranks() {
    let (rank0, others) = job(5);
    let stores: Vec<Arc<TcpStore>> = std::iter::once(rank0).chain(others).map(Arc::new).collect();
    let handles: Vec<_> = stores
        .iter()
        .cloned()
        .enumerate()
        .map(|(rank, s)| {
            thread::spawn(move || {
                s.set(&format!("addr/{rank}"), format!("host-{rank}").as_bytes())
                    .unwrap();
                let mut last = 0;
                for _ in 0..10 {
                    last = s.add("counter", 1).unwrap();
                }
                assert!(last >= 10);
                barrier(&*s, "b1", rank, 5, TIMEOUT).unwrap();
                // After the barrier everyone has set its address and added.
                for peer in 0..5 {
                    let v = s.get(&format!("addr/{peer}"), TIMEOUT).unwrap();
                    assert_eq!(v, format!("host-{peer}").into_bytes());
                }
                assert_eq!(s.add("counter", 0).unwrap(), 50);
                barrier(&*s, "b2", rank, 5, TIMEOUT).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Overwrite, empty and binary values.
    stores[1].set("k", b"one").unwrap();
    stores[2].set("k", &[0, 255, 10]).unwrap();
    assert_eq!(stores[3].get("k", TIMEOUT).unwrap(), vec![0, 255, 10]);
    stores[4].set("empty", b"").unwrap();
    assert_eq!(stores[0].get("empty", TIMEOUT).unwrap(), Vec::<u8>::new());
    assert_eq!(stores[0].add("neg", -3).unwrap(), -3);
    // ADD on a value that is not a number is refused, not crashed on.
    let e = stores[1].add("k", 1).unwrap_err().to_string();
    assert!(e.contains("not an integer"), "{e}");
    // The connection still works afterwards.
    assert_eq!(stores[1].add("neg", 1).unwrap(), -2);
}

#[test]
fn get_waits_for_a_later_set_without_blocking_others() {
    let (rank0, mut others) = job(3);
    let waiter = others.remove(0);
    let setter = others.remove(0);
    let start = Instant::now();
    let t = thread::spawn(move || {
        let v = waiter.get("late", TIMEOUT).unwrap();
        (v, waiter)
    });
    thread::sleep(Duration::from_millis(200));
    // While rank 1 waits, rank 0 and rank 2 are served.
    rank0.set("other", b"x").unwrap();
    assert_eq!(setter.get("other", TIMEOUT).unwrap(), b"x");
    setter.set("late", b"here").unwrap();
    let (v, _waiter) = t.join().unwrap();
    assert_eq!(v, b"here");
    assert!(start.elapsed() < TIMEOUT);
}

#[test]
fn get_times_out_with_a_clear_error() {
    let (_rank0, others) = job(2);
    let start = Instant::now();
    let e = others[0]
        .get("never", Duration::from_millis(300))
        .unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(matches!(e, CommError::Timeout { rank: 1, .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("rank 1: store get: timed out after 300ms"),
        "{text}"
    );
    assert!(text.contains("key \"never\""), "{text}");
    assert!(text.contains("127.0.0.1:"), "{text}");
    // The connection is still usable after a timeout.
    others[0].set("after", b"1").unwrap();
    assert_eq!(others[0].get("after", TIMEOUT).unwrap(), b"1");
}

#[test]
fn dropping_rank_0_fails_clients_quickly() {
    let (rank0, mut others) = job(3);
    others[0].set("k", b"v").unwrap();
    let waiter = others.remove(1);
    let t = thread::spawn(move || {
        let start = Instant::now();
        let r = waiter.get("never", Duration::from_secs(60));
        (r, start.elapsed())
    });
    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    drop(rank0);
    assert!(start.elapsed() < Duration::from_secs(10));
    let (r, waited) = t.join().unwrap();
    let e = r.unwrap_err();
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    assert!(
        matches!(
            e,
            CommError::PeerLost {
                rank: 2,
                peer: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let start = Instant::now();
    let e = others[0].get("k", Duration::from_secs(60)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(
            e,
            CommError::PeerLost {
                rank: 1,
                peer: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("rendezvous store at 127.0.0.1:"),
        "{e}"
    );
    assert!(others[0].add("k", 1).is_err());
}

#[test]
fn connecting_to_nothing_names_the_address() {
    // A port that was free a moment ago.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let e =
        TcpStore::connect(&RankInfo::local(3, 4, port), Duration::from_millis(500)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "rank 3: could not reach the rendezvous store at 127.0.0.1:{port} within 500ms: "
        )),
        "{text}"
    );
    assert!(text.contains("connection refused"), "{text}");
}

#[test]
fn clients_may_start_before_rank_0() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let early = thread::spawn(move || TcpStore::connect(&RankInfo::local(1, 2, port), TIMEOUT));
    thread::sleep(Duration::from_millis(300));
    let rank0 = TcpStore::connect(&RankInfo::local(0, 2, port), TIMEOUT).unwrap();
    assert_eq!(rank0.port(), port);
    let client = early.join().unwrap().unwrap();
    client.set("hello", b"world").unwrap();
    assert_eq!(rank0.get("hello", TIMEOUT).unwrap(), b"world");
}

#[test]
fn port_0_is_only_for_rank_0() {
    let e = TcpStore::connect(&RankInfo::local(2, 4, 0), TIMEOUT).unwrap_err();
    assert!(matches!(e, CommError::Usage(_)), "{e:?}");
    assert!(e.to_string().contains("MASTER_PORT is 0"), "{e}");
}

#[test]
fn barrier_times_out_naming_the_missing_ranks() {
    let (rank0, _others) = job(3);
    let e = barrier(&rank0, "lonely", 0, 3, Duration::from_millis(200)).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("barrier"), "{text}");
    assert!(text.contains("only 1 arrived"), "{text}");
}

#[test]
fn something_else_on_the_port_is_reported() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = thread::spawn(move || {
        // Answer every connection with garbage.
        listener.set_nonblocking(true).unwrap();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            if let Ok((mut s, _)) = listener.accept() {
                let _ = s.write_all(b"HTTP/1.1 400\r\n");
            }
            thread::sleep(Duration::from_millis(5));
        }
    });
    let e =
        TcpStore::connect(&RankInfo::local(1, 2, port), Duration::from_millis(300)).unwrap_err();
    assert!(e.to_string().contains("does not speak"), "{e}");
    t.join().unwrap();
}

/// Real processes: `launch` starts three copies of this test binary, each
/// running only [`launched_rank`], which rendezvous through the store.
#[test]
fn processes_rendezvous_under_launch() {
    use polychip_comm::launch::{LaunchOptions, launch};
    let exe = std::env::current_exe().unwrap();
    let mut opts = LaunchOptions::new(
        3,
        vec![
            exe.to_string_lossy().into_owned(),
            "launched_rank".into(),
            "--exact".into(),
            "--quiet".into(),
            "--test-threads=1".into(),
        ],
    );
    opts.grace = Duration::from_secs(2);
    let outcome = launch(&opts).unwrap();
    assert!(outcome.success(), "{outcome:?}");
}

/// One rank of [`processes_rendezvous_under_launch`]; does nothing when run
/// by the ordinary test harness.
#[test]
fn launched_rank() {
    if std::env::var("POLYCHIP_LAUNCHER").as_deref() != Ok("1") {
        return;
    }
    let me = polychip_comm::env::from_env().unwrap();
    assert_eq!(me.launcher, "polychip launch");
    assert_eq!(me.world_size, 3);
    let store = TcpStore::connect(&me, TIMEOUT).unwrap();
    store
        .set(
            &format!("pid/{}", me.rank),
            std::process::id().to_string().as_bytes(),
        )
        .unwrap();
    barrier(&store, "up", me.rank, me.world_size, TIMEOUT).unwrap();
    for peer in 0..me.world_size {
        store.get(&format!("pid/{peer}"), TIMEOUT).unwrap();
    }
    assert!(store.add("sum", me.rank as i64 + 1).unwrap() > 0);
    // Rank 0 serves the store: it leaves last.
    barrier(&store, "done", me.rank, me.world_size, TIMEOUT).unwrap();
    if me.rank == 0 {
        assert_eq!(store.add("sum", 0).unwrap(), 6);
        store.wait_for_others_to_leave(TIMEOUT).unwrap();
    }
}

#[test]
fn rank_0_waits_for_the_others_to_leave() {
    let (rank0, mut others) = job(3);
    let e = others[0]
        .wait_for_others_to_leave(Duration::from_millis(10))
        .unwrap_err();
    assert!(matches!(e, CommError::Usage(_)), "{e:?}");
    let e = rank0
        .wait_for_others_to_leave(Duration::from_millis(200))
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 other rank(s) still connected"), "{e}");
    let last = others.pop().unwrap();
    drop(others);
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        last.set("bye", b"1").unwrap();
        drop(last);
    });
    rank0.wait_for_others_to_leave(TIMEOUT).unwrap();
    assert_eq!(rank0.get("bye", TIMEOUT).unwrap(), b"1");
    t.join().unwrap();
}

// ------------------------------------------------ who may join (issue 15)

fn auth(secret: &str, job: &str) -> JobAuth {
    JobAuth::new(secret, job).unwrap()
}

#[test]
fn a_rank_with_another_secret_or_job_is_refused_by_name() {
    let a = auth("the job's own secret", "job-a");
    let rank0 = TcpStore::connect_with(&RankInfo::local(0, 2, 0), &a, TIMEOUT).unwrap();
    let port = rank0.port();
    let started = Instant::now();
    let e = TcpStore::connect_with(
        &RankInfo::local(1, 2, port),
        &auth("somebody else's secret", "job-a"),
        TIMEOUT,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("POLYCHIP_JOB_SECRET") && e.contains(&port.to_string()),
        "{e}"
    );
    // Refused at once, not retried until the timeout.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let e = TcpStore::connect_with(
        &RankInfo::local(1, 2, port),
        &auth("the job's own secret", "job-b"),
        TIMEOUT,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("job-b"), "{e}");
    // Neither counts as a rank: rank 0 is alone and may leave at once.
    rank0
        .wait_for_others_to_leave(Duration::from_millis(500))
        .unwrap();
    // The real rank 1 still gets in.
    let rank1 = TcpStore::connect_with(&RankInfo::local(1, 2, port), &a, TIMEOUT).unwrap();
    rank1.set("k", b"v").unwrap();
    assert_eq!(rank0.get("k", TIMEOUT).unwrap(), b"v");
}

#[test]
fn idle_or_foreign_connections_neither_join_nor_hold_up_the_shutdown() {
    use std::io::{Read, Write};
    let a = auth("the job's own secret", "job");
    let rank0 = TcpStore::connect_with(&RankInfo::local(0, 2, 0), &a, TIMEOUT).unwrap();
    let port = rank0.port();
    // One connection that never says a word, one that speaks another
    // protocol.
    let mut idle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut http = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    http.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let rank1 = TcpStore::connect_with(&RankInfo::local(1, 2, port), &a, TIMEOUT).unwrap();
    drop(rank1);
    let started = Instant::now();
    rank0.wait_for_others_to_leave(TIMEOUT).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The server hangs up on both: the foreign one at once, the idle one
    // after its 5 s to prove itself.
    idle.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    http.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(http.read(&mut buf).unwrap_or(0), 0);
    let mut got = Vec::new();
    let _ = idle.read_to_end(&mut got);
    // It got the server's challenge (magic, nonce, tag) and nothing more.
    assert!(got.is_empty() || got.len() == 5 + 16 + 32, "{}", got.len());
}

#[test]
fn what_one_client_may_store_is_bounded() {
    let a = auth("the job's own secret", "job");
    let rank0 = TcpStore::connect_with(&RankInfo::local(0, 1, 0), &a, TIMEOUT).unwrap();
    let e = rank0
        .set("big", &vec![0u8; (16 << 20) + 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"big\"") && e.contains("16777217 bytes"), "{e}");
    let value = vec![7u8; 16 << 20];
    let mut refused = None;
    for i in 0..20 {
        if let Err(e) = rank0.set(&format!("k{i}"), &value) {
            refused = Some((i, e.to_string()));
            break;
        }
    }
    let (i, e) = refused.expect("the store refuses to grow past its bound");
    assert!(i >= 15 && e.contains("at most 268435456 bytes"), "{i}: {e}");
    // Overwriting keeps the total, and the store still answers.
    rank0.set("k0", b"small now").unwrap();
    rank0.set(&format!("k{i}"), &value).unwrap();
    assert_eq!(rank0.get("k0", TIMEOUT).unwrap(), b"small now");
}

#[test]
fn other_launchers_must_pass_the_secret() {
    if std::env::var_os("POLYCHIP_JOB_SECRET").is_some() {
        eprintln!("skipped: POLYCHIP_JOB_SECRET is set in this environment");
        return;
    }
    let mut me = RankInfo::local(1, 2, 29500);
    me.launcher = "torchrun";
    let e = TcpStore::connect(&me, Duration::from_millis(200))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("POLYCHIP_JOB_SECRET is not set") && e.contains("torchrun"),
        "{e}"
    );
    // Started by hand (no launcher), ranks of one user meet through the
    // user's own secret.
    let rank0 = TcpStore::connect(&RankInfo::local(0, 2, 0), TIMEOUT).unwrap();
    let rank1 = TcpStore::connect(&RankInfo::local(1, 2, rank0.port()), TIMEOUT).unwrap();
    rank1.set("k", b"v").unwrap();
    assert_eq!(rank0.get("k", TIMEOUT).unwrap(), b"v");
}

#[test]
fn the_store_serves_on_an_ipv6_address_written_in_brackets() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    }
    let at = |rank: usize, port: u16| RankInfo {
        master_addr: "[::1]".to_string(),
        ..RankInfo::local(rank, 2, port)
    };
    let server = TcpStore::connect(&at(0, 0), TIMEOUT).unwrap();
    let client = TcpStore::connect(&at(1, server.port()), TIMEOUT).unwrap();
    client.set("k", b"v6").unwrap();
    assert_eq!(server.get("k", TIMEOUT).unwrap(), b"v6".to_vec());
}

// ------------------------------------ connections that never prove themselves

/// Reads until the server closes the connection or `limit` passes: the
/// bytes read, and whether it was closed.
fn read_until_closed(s: &mut std::net::TcpStream, limit: Duration) -> (usize, bool) {
    use std::io::Read;
    let until = Instant::now() + limit;
    let mut total = 0;
    let mut buf = [0u8; 256];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (total, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (total, true),
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (total, true),
            Err(_) => return (total, false),
        }
    }
}

/// Sends `bytes` one at a time, `gap` apart, until the server hangs up.
fn trickle(mut s: std::net::TcpStream, bytes: Vec<u8>, gap: Duration) -> thread::JoinHandle<()> {
    use std::io::Write;
    thread::spawn(move || {
        for b in bytes {
            if s.write_all(&[b]).is_err() {
                return;
            }
            thread::sleep(gap);
        }
    })
}

#[test]
fn a_trickling_client_is_dropped_within_the_handshake_limit() {
    use std::io::{Read, Write};
    let a = auth("the job's own secret", "job");
    let rank0 = TcpStore::connect_with(&RankInfo::local(0, 2, 0), &a, TIMEOUT).unwrap();
    let port = rank0.port();
    let start = Instant::now();
    // One trickles its hello, a byte every 400 ms (all of it would take 8 s).
    let slow_hello = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut hello = b"PCST\x02".to_vec();
    hello.extend_from_slice(&[0u8; 16]);
    let t1 = trickle(
        slow_hello.try_clone().unwrap(),
        hello.clone(),
        Duration::from_millis(400),
    );
    // The other sends its hello at once, then trickles a 64 KiB job id.
    let mut slow_id = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow_id.write_all(&hello).unwrap();
    let mut answer = [0u8; 5 + 16 + 32];
    slow_id
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    slow_id.read_exact(&mut answer).unwrap();
    let mut proof = 1u64.to_le_bytes().to_vec();
    proof.extend_from_slice(&(64u32 << 10).to_le_bytes());
    proof.extend_from_slice(&[b'j'; 64 << 10]);
    let t2 = trickle(
        slow_id.try_clone().unwrap(),
        proof,
        Duration::from_millis(400),
    );

    let mut slow_hello = slow_hello;
    let (got, closed) = read_until_closed(&mut slow_hello, Duration::from_secs(20));
    let took = start.elapsed();
    assert!(closed && got == 0, "closed {closed} after {got} bytes");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(7),
        "a trickled hello was dropped after {took:?}; the limit is 5 s"
    );
    let (got, closed) = read_until_closed(&mut slow_id, Duration::from_secs(20));
    let took = start.elapsed();
    assert!(closed && got == 0, "closed {closed} after {got} more bytes");
    assert!(
        took < Duration::from_secs(7),
        "a trickled job id was dropped after {took:?}; the limit is 5 s"
    );
    t1.join().unwrap();
    t2.join().unwrap();
    // The job is not held up.
    let rank1 = TcpStore::connect_with(&RankInfo::local(1, 2, port), &a, TIMEOUT).unwrap();
    rank1.set("k", b"v").unwrap();
    assert_eq!(rank0.get("k", TIMEOUT).unwrap(), b"v");
}

#[test]
fn a_flood_of_unauthenticated_connections_is_capped_and_the_job_still_works() {
    use polychip_comm::tcp_store::MAX_HANDSHAKING;
    use std::io::Write;
    let a = auth("the job's own secret", "job");
    let rank0 = TcpStore::connect_with(&RankInfo::local(0, 2, 0), &a, TIMEOUT).unwrap();
    let port = rank0.port();
    // 300 connections that each send one byte of a hello and stop.
    let mut flood: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
            s.write_all(b"P").ok()?;
            Some(s)
        })
        .collect();
    assert!(flood.len() >= 250, "{} connections opened", flood.len());
    let opened = Instant::now();
    thread::sleep(Duration::from_millis(500));
    // At most MAX_HANDSHAKING of them still hold a thread on rank 0: the
    // others were closed at once (or dropped to make room).
    let open = flood
        .iter_mut()
        .map(|s| read_until_closed(s, Duration::from_millis(10)).1)
        .filter(|closed| !closed)
        .count();
    assert!(
        open <= MAX_HANDSHAKING,
        "{open} unauthenticated connections still open; the cap is {MAX_HANDSHAKING}"
    );
    // A rank still gets in while they are open.
    let joined = Instant::now();
    let rank1 = TcpStore::connect_with(&RankInfo::local(1, 2, port), &a, TIMEOUT).unwrap();
    assert!(
        joined.elapsed() < Duration::from_secs(4),
        "rank 1 joined after {:?}",
        joined.elapsed()
    );
    rank1.set("k", b"v").unwrap();
    assert_eq!(rank0.get("k", TIMEOUT).unwrap(), b"v");
    // And none of the flood outlives its 5 s (from when rank 0 accepted
    // it, at the latest when the last one was open; 3 s spare for a busy
    // machine).
    let until = opened + Duration::from_secs(8);
    for (i, s) in flood.iter_mut().enumerate() {
        let left = until.saturating_duration_since(Instant::now());
        assert!(
            read_until_closed(s, left.max(Duration::from_millis(10))).1,
            "connection {i} still open {:?} after the flood",
            opened.elapsed()
        );
    }
    drop(rank1);
    rank0.wait_for_others_to_leave(TIMEOUT).unwrap();
}

#[test]
fn many_ranks_joining_at_once_all_get_in_despite_the_cap() {
    use polychip_comm::tcp_store::MAX_HANDSHAKING;
    let world = 4 * MAX_HANDSHAKING + 1;
    let a = auth("the job's own secret", "job");
    let rank0 = TcpStore::connect_with(&RankInfo::local(0, world, 0), &a, TIMEOUT).unwrap();
    let port = rank0.port();
    let barrier_ = Arc::new(std::sync::Barrier::new(world - 1));
    let ranks: Vec<_> = (1..world)
        .map(|r| {
            let a = a.clone();
            let barrier_ = Arc::clone(&barrier_);
            thread::spawn(move || {
                barrier_.wait();
                let store = TcpStore::connect_with(&RankInfo::local(r, world, port), &a, TIMEOUT)?;
                barrier(&store, "all-in", r, world, TIMEOUT)?;
                Ok::<_, CommError>(())
            })
        })
        .collect();
    barrier(&rank0, "all-in", 0, world, TIMEOUT).unwrap();
    for r in ranks {
        r.join().unwrap().unwrap();
    }
    rank0.wait_for_others_to_leave(TIMEOUT).unwrap();
}
