//! Who may join the TCP transport's mesh: a connection takes a rank's place
//! only once it proved it holds the job's secret. A stranger that claims a
//! rank, a stalled connection, a flood of them, an impostor listening at a
//! rank's address and ranks given different secrets, each against threads
//! as ranks over loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use polychip_comm::CommError;
use polychip_comm::auth::JobAuth;
use polychip_comm::store::{MemoryStore, Store};
use polychip_comm::tcp::{TcpOptions, TcpTransport};
use polychip_comm::transport::{SignalId, Transport};

/// The magic of the mesh's hello ("PCH2").
const MAGIC: u32 = 0x3248_4350;
/// Magic, rank, world size, generation, nonce.
const HELLO_LEN: usize = 40;

/// The job's secret of these tests' meshes.
const SECRET: &str = "the job's secret 0123";

fn options(secret: &str) -> TcpOptions {
    TcpOptions {
        auth: Some(JobAuth::new(secret, "mesh-test").expect("a secret")),
        ..TcpOptions::default()
    }
}

fn start_rank(
    store: &Arc<dyn Store>,
    rank: usize,
    world: usize,
    timeout: Duration,
    options: TcpOptions,
) -> JoinHandle<polychip_comm::Result<TcpTransport>> {
    let store = Arc::clone(store);
    thread::spawn(move || TcpTransport::with_options(store, rank, world, timeout, options))
}

/// `rank` of a two-rank mesh holding the job's secret, started on a thread.
fn job_rank(
    store: &Arc<dyn Store>,
    rank: usize,
    timeout: Duration,
) -> JoinHandle<polychip_comm::Result<TcpTransport>> {
    start_rank(store, rank, 2, timeout, options(SECRET))
}

/// The two ranks' transports, once both are built.
fn joined(
    rank0: JoinHandle<polychip_comm::Result<TcpTransport>>,
    rank1: JoinHandle<polychip_comm::Result<TcpTransport>>,
) -> Vec<TcpTransport> {
    vec![
        rank0.join().unwrap().unwrap(),
        rank1.join().unwrap().unwrap(),
    ]
}

/// Where `rank` of the first mesh built over `store` listens.
fn address_of(store: &dyn Store, rank: usize) -> SocketAddr {
    let raw = store
        .get(
            &format!("polychip/tcp/1/addr/{rank}"),
            Duration::from_secs(10),
        )
        .expect("the rank publishes its address");
    String::from_utf8(raw).unwrap().parse().unwrap()
}

/// A hello claiming `rank` of a mesh of `world` (generation 1).
fn forged_hello(rank: u32, world: u64) -> Vec<u8> {
    let mut b = MAGIC.to_le_bytes().to_vec();
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&world.to_le_bytes());
    b.extend_from_slice(&1i64.to_le_bytes());
    b.extend_from_slice(&[7u8; 16]);
    assert_eq!(b.len(), HELLO_LEN);
    b
}

/// Both ranks of a 2-rank mesh write to each other and read what came.
fn exchange(ranks: Vec<TcpTransport>) {
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            thread::spawn(move || {
                let (id, ptr) = t.register(8).expect("register");
                let me = t.rank();
                t.write(1 - me, id, 0, &[me as u8 + 1; 8], SignalId(1))
                    .expect("write");
                t.wait(SignalId(1), 1, Instant::now() + Duration::from_secs(10))
                    .expect("wait");
                // SAFETY: the region lives as long as `t`, and its 8 bytes
                // were written before the signal was raised.
                let got = unsafe { std::slice::from_raw_parts(ptr, 8) }.to_vec();
                (me, got, t)
            })
        })
        .collect();
    let done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (me, got, _) in &done {
        assert_eq!(
            got,
            &[(1 - *me) as u8 + 1; 8],
            "rank {me} got its peer's bytes"
        );
    }
}

/// Reads until the connection closes (`Ok(bytes read)`) or `limit` passes.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> std::io::Result<usize> {
    s.set_read_timeout(Some(limit))?;
    let mut total = 0;
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(total),
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn a_stranger_without_the_secret_cannot_claim_a_rank() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rank0 = job_rank(&store, 0, Duration::from_secs(20));
    let addr = address_of(&*store, 0);

    // The old attack: a hello of the unauthenticated protocol.
    let mut old = TcpStream::connect(addr).unwrap();
    let mut hello = 0x5043_5448u32.to_le_bytes().to_vec();
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&2u64.to_le_bytes());
    hello.extend_from_slice(&1i64.to_le_bytes());
    old.write_all(&hello).unwrap();

    // A stranger that knows the protocol but not the secret: it gets rank
    // 0's hello and nonce, answers with a made-up proof, and is dropped
    // without a proof back.
    let mut stranger = TcpStream::connect(addr).unwrap();
    stranger.write_all(&forged_hello(1, 2)).unwrap();
    let mut theirs = [0u8; HELLO_LEN];
    stranger
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stranger.read_exact(&mut theirs).unwrap();
    assert_eq!(theirs[..4], MAGIC.to_le_bytes(), "rank 0's hello");
    stranger.write_all(&[0x55; 32]).unwrap();
    let t = Instant::now();
    assert_eq!(
        read_to_close(&mut stranger, Duration::from_secs(10)).unwrap(),
        0,
        "no proof for a stranger"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "dropped at once");
    assert_eq!(
        read_to_close(&mut old, Duration::from_secs(10)).unwrap(),
        40
    );
    assert!(
        !rank0.is_finished(),
        "the stranger did not take rank 1's place"
    );

    // The real rank 1 still gets in, and the two exchange data.
    let rank1 = job_rank(&store, 1, Duration::from_secs(20));
    let ranks = joined(rank0, rank1);
    exchange(ranks);
}

#[test]
fn a_stalled_connection_does_not_delay_the_mesh() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rank0 = job_rank(&store, 0, Duration::from_secs(30));
    let addr = address_of(&*store, 0);
    // One that sends nothing, one that stops halfway through its hello.
    let silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&forged_hello(1, 2)[..10]).unwrap();
    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let rank1 = job_rank(&store, 1, Duration::from_secs(30));
    let ranks = joined(rank0, rank1);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the mesh took {took:?} with two stalled connections open"
    );
    exchange(ranks);
    drop((silent, half));
}

#[test]
fn a_stalled_connection_is_dropped_within_the_hello_limit() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rank0 = job_rank(&store, 0, Duration::from_secs(30));
    let addr = address_of(&*store, 0);
    let mut silent = TcpStream::connect(addr).unwrap();
    let start = Instant::now();
    // Rank 0's hello (40 bytes), then the close.
    let got = read_to_close(&mut silent, Duration::from_secs(20)).unwrap();
    let took = start.elapsed();
    assert_eq!(got, HELLO_LEN);
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(7),
        "dropped after {took:?}; the limit is 5 s"
    );
    let rank1 = job_rank(&store, 1, Duration::from_secs(30));
    exchange(joined(rank0, rank1));
}

#[test]
fn a_flood_of_stalled_connections_does_not_lock_a_rank_out() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rank0 = job_rank(&store, 0, Duration::from_secs(30));
    let addr = address_of(&*store, 0);
    // More than the acceptor handshakes with at once (64).
    let flood: Vec<_> = (0..150)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect();
    assert!(flood.len() >= 100, "{} connections opened", flood.len());
    thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let rank1 = job_rank(&store, 1, Duration::from_secs(30));
    let ranks = joined(rank0, rank1);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "the mesh took {took:?} behind {} stalled connections",
        flood.len()
    );
    exchange(ranks);
}

#[test]
fn ranks_with_different_secrets_do_not_form_a_mesh() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let timeout = Duration::from_secs(3);
    let rank0 = start_rank(&store, 0, 2, timeout, options(SECRET));
    let rank1 = start_rank(&store, 1, 2, timeout, options("another secret 456789"));
    let e0 = rank0.join().unwrap().unwrap_err();
    let e1 = rank1.join().unwrap().unwrap_err();
    assert!(matches!(e0, CommError::Timeout { .. }), "{e0}");
    assert!(e1.to_string().contains("same job secret"), "{e1}");
}

#[test]
fn an_impostor_at_a_ranks_address_is_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    // The impostor publishes itself as rank 0 of generation 1 and answers
    // with a valid hello but cannot prove the secret.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    store
        .set(
            "polychip/tcp/1/addr/0",
            listener.local_addr().unwrap().to_string().as_bytes(),
        )
        .unwrap();
    let impostor = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&forged_hello(0, 2)).unwrap();
        let mut theirs = [0u8; HELLO_LEN + 32];
        s.read_exact(&mut theirs).unwrap();
        s.write_all(&[0x33; 32]).unwrap();
        let _ = read_to_close(&mut s, Duration::from_secs(10));
    });
    let rank1 = job_rank(&store, 1, Duration::from_secs(10));
    let e = rank1.join().unwrap().unwrap_err();
    assert!(
        matches!(e, CommError::PeerLost { peer: 0, .. })
            && e.to_string()
                .contains("could not prove it holds this job's secret"),
        "{e}"
    );
    impostor.join().unwrap();
}
