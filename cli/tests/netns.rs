//! Two hosts on one machine: ranks in two network namespaces joined by a
//! veth pair (made by the test, loopback-only otherwise), the TCP
//! transport between them, a short `polychip train` across them; then the
//! link is delayed (where the kernel has netem) and cut mid-run: the job
//! survives the delay, reports the cut on every rank within its timeout,
//! and the last checkpoint stays intact.
//!
//! Needs root (to make namespaces) and iproute2; elsewhere it says why and
//! passes.

mod common;
use common::polychip_env;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Two namespaces joined by a veth pair, removed on drop.
struct Hosts {
    a: String,
    b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    fn new() -> Result<Hosts, String> {
        let id = std::process::id() % 100_000;
        let hosts = Hosts {
            a: format!("pc{id}a"),
            b: format!("pc{id}b"),
        };
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        let (va, vb) = (format!("v{id}a"), format!("v{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &hosts.a])?;
        ip(&["link", "set", &vb, "netns", &hosts.b])?;
        ip(&["-n", &hosts.a, "addr", "add", "10.77.0.1/24", "dev", &va])?;
        ip(&["-n", &hosts.b, "addr", "add", "10.77.0.2/24", "dev", &vb])?;
        for (ns, dev) in [(&hosts.a, &va), (&hosts.b, &vb)] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(hosts)
    }

    fn dev_a(&self) -> String {
        format!("v{}a", &self.a[2..self.a.len() - 1])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// The job both hosts run, and the same job on one host to compare with.
const PIPELINE: [&str; 12] = [
    "train",
    "--model",
    "mini",
    "--global-batch",
    "8",
    "--stages",
    "ferrite:0=0..1,cobalt:0=1..2",
    "--eval-every",
    "0",
    "--log-every",
    "1",
    "--no-pin",
];

/// Rank `rank` of the 2-rank pipeline in namespace `ns`.
fn rank(ns: &str, rank: usize, port: u16, extra: &[&str], log: &Path) -> Child {
    let exe = env!("CARGO_BIN_EXE_polychip");
    let out = std::fs::File::create(log).unwrap();
    Command::new("ip")
        .args(["netns", "exec", ns, exe])
        .args(PIPELINE)
        .args(extra)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", "0")
        .env("LOCAL_WORLD_SIZE", "1")
        .env("MASTER_ADDR", "10.77.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("POLYCHIP_JOB_SECRET", "netns test secret 0123")
        .env("POLYCHIP_TRANSPORT", "tcp")
        .env("POLYCHIP_COMM_TIMEOUT_SECS", "8")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap()
}

/// Waits for both ranks (at most `limit`): their exit codes.
fn wait_both(children: &mut [Child; 2], limit: Duration) -> [Option<i32>; 2] {
    let start = Instant::now();
    let mut codes = [None, None];
    while start.elapsed() < limit && codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none()
                && let Ok(Some(status)) = c.try_wait()
            {
                *code = Some(status.code().unwrap_or(-1));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    codes
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("polychip-netns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn last_loss(log: &Path) -> f64 {
    let text = std::fs::read_to_string(log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("done: step"))
        .unwrap_or_else(|| panic!("{text}"));
    line.split("loss ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn training_across_two_namespaces_survives_a_delay_and_reports_a_cut_link() {
    let hosts = match Hosts::new() {
        Ok(h) => h,
        Err(why) => {
            eprintln!(
                "skipped: cannot make network namespaces here (needs root and iproute2): {why}"
            );
            return;
        }
    };
    let dir = scratch();
    let port = 29_000 + (std::process::id() % 1000) as u16;

    // 1. A short run across the link matches the same plan on one machine.
    let (l0, l1) = (dir.join("r0.log"), dir.join("r1.log"));
    let mut job = [
        rank(&hosts.a, 0, port, &["--steps", "4"], &l0),
        rank(&hosts.b, 1, port, &["--steps", "4"], &l1),
    ];
    let codes = wait_both(&mut job, Duration::from_secs(120));
    let logs = || {
        format!(
            "rank 0:\n{}\nrank 1:\n{}",
            std::fs::read_to_string(&l0).unwrap_or_default(),
            std::fs::read_to_string(&l1).unwrap_or_default()
        )
    };
    assert_eq!(codes, [Some(0), Some(0)], "{}", logs());
    let args: Vec<&str> = PIPELINE.iter().copied().chain(["--steps", "4"]).collect();
    let (code, out, err) = polychip_env(&args, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let local = dir.join("local.log");
    std::fs::write(&local, &out).unwrap();
    assert!(
        (last_loss(&l0) - last_loss(&local)).abs() <= 1e-4,
        "{}\n{out}",
        logs()
    );

    // 2. A delayed link (netem): the job survives it.
    let dev = hosts.dev_a();
    let delayed = Command::new("ip")
        .args([
            "netns", "exec", &hosts.a, "tc", "qdisc", "add", "dev", &dev, "root", "netem",
        ])
        .args(["delay", "20ms", "5ms", "loss", "1%"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if delayed {
        let mut job = [
            rank(&hosts.a, 0, port + 1, &["--steps", "3"], &l0),
            rank(&hosts.b, 1, port + 1, &["--steps", "3"], &l1),
        ];
        let codes = wait_both(&mut job, Duration::from_secs(180));
        assert_eq!(
            codes,
            [Some(0), Some(0)],
            "under delay and loss: {}",
            logs()
        );
        let _ = Command::new("ip")
            .args([
                "netns", "exec", &hosts.a, "tc", "qdisc", "del", "dev", &dev, "root",
            ])
            .status();
    } else {
        eprintln!(
            "skipped the delayed link: this kernel has no netem queueing discipline (sch_netem)"
        );
    }

    // 3. The link cut mid-run: every rank fails within its timeout, naming
    //    the lost peer, and the last checkpoint is whole.
    let ck = dir.join("ck");
    let c = ck.display().to_string();
    let long = [
        "--steps",
        "100000",
        "--checkpoint-dir",
        &c,
        "--save-every",
        "2",
    ];
    let mut job = [
        rank(&hosts.a, 0, port + 2, &long, &l0),
        rank(&hosts.b, 1, port + 2, &long, &l1),
    ];
    let started = Instant::now();
    while !ck.join("latest").exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        ck.join("latest").exists(),
        "no checkpoint within 60 s: {}",
        logs()
    );
    std::thread::sleep(Duration::from_millis(300));
    ip(&["-n", &hosts.a, "link", "set", &dev, "down"]).unwrap();
    let cut = Instant::now();
    let codes = wait_both(&mut job, Duration::from_secs(60));
    let took = cut.elapsed();
    assert!(
        codes.iter().all(|c| matches!(c, Some(c) if *c != 0)),
        "both ranks must fail: {codes:?}\n{}",
        logs()
    );
    // The communication timeout is 8 s; the rest is the ranks' shutdown.
    assert!(took < Duration::from_secs(45), "{took:?}\n{}", logs());
    for (r, log) in [(0, &l0), (1, &l1)] {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(
            text.contains("polychip train: rank"),
            "rank {r} reported nothing:\n{text}"
        );
    }
    let hf = dir.join("hf");
    let (code, out, err) =
        polychip_env(&["checkpoint", "export-hf", &c, hf.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "the last checkpoint must load: {out}{err}");
    eprintln!("cut link: both ranks failed {took:?} after the cut; the checkpoint exported");
    drop(hosts);
    let _ = std::fs::remove_dir_all(&dir);
}
