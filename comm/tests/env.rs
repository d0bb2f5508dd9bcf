//! Reading a rank's place in the job from each launcher's variables, and the
//! sentences given when they are missing or disagree.

use std::collections::HashMap;

use polychip_comm::CommError;
use polychip_comm::env::{RankInfo, bare_host, first_host, from_vars};

fn read(vars: &[(&str, &str)]) -> Result<RankInfo, CommError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    from_vars(|name| map.get(name).cloned())
}

fn error(vars: &[(&str, &str)]) -> String {
    match read(vars) {
        Ok(info) => panic!("expected an error, got {info:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn nothing_set_is_one_rank() {
    let info = read(&[]).unwrap();
    assert_eq!(info, RankInfo::single());
    assert_eq!(
        (
            info.rank,
            info.world_size,
            info.local_rank,
            info.local_world_size
        ),
        (0, 1, 0, 1)
    );
    assert_eq!(info.launcher, "none");
    assert_eq!(info.master_addr, "127.0.0.1");
    assert_eq!(info.master_port, 0);
}

#[test]
fn torchrun() {
    let info = read(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        // Slurm's variables lose to torchrun's.
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
    ])
    .unwrap();
    assert_eq!(
        info,
        RankInfo {
            rank: 5,
            world_size: 8,
            local_rank: 1,
            local_world_size: 4,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            launcher: "torchrun",
        }
    );
}

#[test]
fn polychip_launch() {
    let info = read(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "3"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "3"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "41234"),
        ("POLYCHIP_LAUNCHER", "1"),
    ])
    .unwrap();
    assert_eq!(info.launcher, "polychip launch");
    assert_eq!(
        (info.rank, info.world_size, info.master_port),
        (2, 3, 41234)
    );
}

#[test]
fn torchrun_without_local_variables_is_one_node() {
    let info = read(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ])
    .unwrap();
    assert_eq!((info.local_rank, info.local_world_size), (1, 2));
}

#[test]
fn torchrun_errors() {
    let base = [
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    assert_eq!(
        error(&with(&[("RANK", "5"), ("WORLD_SIZE", "4")])),
        "rendezvous: RANK is 5 but WORLD_SIZE is 4"
    );
    assert_eq!(
        error(&with(&[("RANK", "1")])),
        "rendezvous: RANK is 1 but WORLD_SIZE is not set"
    );
    let e = error(&with(&[("RANK", "x1"), ("WORLD_SIZE", "4")]));
    assert!(
        e.contains("RANK is \"x1\", which is not a non-negative integer"),
        "{e}"
    );
    let e = error(&with(&[("RANK", "0"), ("WORLD_SIZE", "0")]));
    assert!(e.contains("WORLD_SIZE is 0"), "{e}");
    let e = error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "1"),
    ]);
    assert!(
        e.contains("LOCAL_RANK is 2 but LOCAL_WORLD_SIZE is 2"),
        "{e}"
    );
    let e = error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "1"),
    ]);
    assert!(
        e.contains("LOCAL_WORLD_SIZE is 4 but WORLD_SIZE is 2"),
        "{e}"
    );
    let e = error(&[("RANK", "0"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("MASTER_ADDR and MASTER_PORT are not set"), "{e}");
    let e = error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "70000"),
    ]);
    assert!(
        e.contains("MASTER_PORT is \"70000\", which is not a TCP port"),
        "{e}"
    );
    let e = error(&[("WORLD_SIZE", "4")]);
    assert!(e.contains("WORLD_SIZE is 4 but RANK is not set"), "{e}");
}

#[test]
fn world_of_one_needs_no_master() {
    let info = read(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap();
    assert_eq!(
        (info.master_addr.as_str(), info.master_port),
        ("127.0.0.1", 0)
    );
}

#[test]
fn open_mpi() {
    let vars = [
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29501"),
        ("SLURM_PROCID", "0"),
    ];
    let info = read(&vars).unwrap();
    assert_eq!(
        info,
        RankInfo {
            rank: 3,
            world_size: 4,
            local_rank: 1,
            local_world_size: 2,
            master_addr: "node0".into(),
            master_port: 29501,
            launcher: "mpirun",
        }
    );
    // No MASTER_ADDR/MASTER_PORT: say so, and that PMIx's URI is no substitute.
    let e = error(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("PMIX_SERVER_URI", "pmix-server.1234;tcp4://127.0.0.1:5555"),
    ]);
    assert!(e.contains("MASTER_ADDR and MASTER_PORT are not set"), "{e}");
    assert!(e.contains("PMIX_SERVER_URI"), "{e}");
    assert!(e.contains("mpirun -x MASTER_ADDR"), "{e}");
    let e = error(&[
        ("OMPI_COMM_WORLD_RANK", "4"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29501"),
    ]);
    assert_eq!(
        e,
        "rendezvous: OMPI_COMM_WORLD_RANK is 4 but OMPI_COMM_WORLD_SIZE is 4"
    );
    let e = error(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")]);
    assert!(e.contains("OMPI_COMM_WORLD_LOCAL_RANK is not set"), "{e}");
}

fn slurm_vars() -> Vec<(&'static str, &'static str)> {
    vec![
        ("SLURM_PROCID", "6"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "2"),
        ("SLURM_TASKS_PER_NODE", "4(x2)"),
        ("SLURM_JOB_NODELIST", "gpu[07-08,11]"),
        ("SLURM_JOB_ID", "123456"),
    ]
}

#[test]
fn slurm() {
    let info = read(&slurm_vars()).unwrap();
    assert_eq!(
        info,
        RankInfo {
            rank: 6,
            world_size: 8,
            local_rank: 2,
            local_world_size: 4,
            master_addr: "gpu07".into(),
            master_port: 29500 + 456,
            launcher: "slurm",
        }
    );
    // MASTER_ADDR/MASTER_PORT and SLURM_NTASKS_PER_NODE win.
    let mut vars = slurm_vars();
    vars.extend([
        ("MASTER_ADDR", "login1"),
        ("MASTER_PORT", "1234"),
        ("SLURM_NTASKS_PER_NODE", "8"),
    ]);
    let info = read(&vars).unwrap();
    assert_eq!(
        (
            info.master_addr.as_str(),
            info.master_port,
            info.local_world_size
        ),
        ("login1", 1234, 8)
    );
}

#[test]
fn slurm_errors() {
    let mut vars = slurm_vars();
    vars.retain(|(k, _)| *k != "SLURM_JOB_NODELIST");
    let e = error(&vars);
    assert!(e.contains("SLURM_JOB_NODELIST"), "{e}");
    let mut vars = slurm_vars();
    vars.retain(|(k, _)| *k != "SLURM_TASKS_PER_NODE");
    let e = error(&vars);
    assert!(e.contains("SLURM_TASKS_PER_NODE is set"), "{e}");
    let mut vars = slurm_vars();
    vars[0] = ("SLURM_PROCID", "9");
    assert_eq!(
        error(&vars),
        "rendezvous: SLURM_PROCID is 9 but SLURM_NTASKS is 8"
    );
    let mut vars = slurm_vars();
    vars[2] = ("SLURM_LOCALID", "4");
    assert_eq!(
        error(&vars),
        "rendezvous: SLURM_LOCALID is 4 but SLURM_TASKS_PER_NODE is 4"
    );
}

#[test]
fn an_ipv6_master_addr_in_brackets_is_taken_without_them() {
    assert_eq!(bare_host("[::1]"), "::1");
    assert_eq!(bare_host("[fe80::1]"), "fe80::1");
    assert_eq!(bare_host("::1"), "::1");
    assert_eq!(bare_host("node01"), "node01");
    // Not an IPv6 address in brackets: left as it is (resolving names it).
    assert_eq!(bare_host("[node01]"), "[node01]");
    assert_eq!(bare_host("[::1"), "[::1");
}

#[test]
fn slurm_node_lists() {
    assert_eq!(first_host("node[01-04,07]").as_deref(), Some("node01"));
    assert_eq!(first_host("node[3,5]").as_deref(), Some("node3"));
    assert_eq!(first_host("alpha,beta").as_deref(), Some("alpha"));
    assert_eq!(first_host("single").as_deref(), Some("single"));
    assert_eq!(
        first_host("rack[1-2]-n[3-4],x").as_deref(),
        Some("rack1-n3")
    );
    assert_eq!(first_host("").as_deref(), None);
}

#[test]
fn huge_counts_are_refused_by_name() {
    let max = "18446744073709551615"; // 2^64 - 1
    let e = error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", max),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]);
    assert!(
        e.contains("WORLD_SIZE is 18446744073709551615, more than the 65536"),
        "{e}"
    );
    let e = error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "99999999999"),
    ]);
    assert!(e.contains("LOCAL_RANK is 99999999999, more than"), "{e}");
    let e = error(&[("RANK", "0"), ("WORLD_SIZE", "18446744073709551616")]);
    assert!(e.contains("not a non-negative integer"), "{e}");
    let e = error(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "65536")]);
    assert!(
        e.contains("MASTER_PORT is \"65536\", which is not a TCP port"),
        "{e}"
    );
}

#[test]
fn timeouts_must_be_positive_finite_seconds() {
    use polychip_comm::env::parse_timeout;
    use std::time::Duration;
    assert_eq!(parse_timeout(None).unwrap(), Duration::from_secs(60));
    assert_eq!(parse_timeout(Some(" ")).unwrap(), Duration::from_secs(60));
    assert_eq!(
        parse_timeout(Some("2.5")).unwrap(),
        Duration::from_millis(2500)
    );
    assert_eq!(
        parse_timeout(Some("604800")).unwrap(),
        Duration::from_secs(604_800)
    );
    for bad in ["inf", "-1", "abc", "0", "nan", "1e300", "604801", "-inf"] {
        let e = parse_timeout(Some(bad)).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "POLYCHIP_COMM_TIMEOUT_SECS is {bad:?}, which is not a number of seconds"
            )),
            "{bad}: {e}"
        );
    }
}

/// A `MASTER_ADDR` no socket call could take (100 KB long, or holding an
/// escape sequence) is refused by name before any rank waits on it, and
/// the message quotes it escaped and cut: it used to be accepted, then
/// echoed raw and whole by the store's connection errors.
#[test]
fn a_master_addr_that_is_no_host_is_refused_quoted_and_cut() {
    let long = "h".repeat(100_000);
    let torchrun = |addr: &'static str| {
        vec![
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", addr),
            ("MASTER_PORT", "29500"),
        ]
    };
    let long: &'static str = Box::leak(long.into_boxed_str());
    for vars in [
        torchrun(long),
        vec![("MASTER_ADDR", long)],
        vec![
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("MASTER_ADDR", long),
        ],
    ] {
        let e = error(&vars);
        assert!(e.contains("MASTER_ADDR is \"hhh"), "{e}");
        assert!(
            e.contains("… (100000 bytes), longer than the 255 bytes"),
            "{e}"
        );
        assert!(e.len() < 600, "{} bytes", e.len());
    }
    let e = error(&torchrun("node0\u{1b}]0;pwned\u{7}"));
    assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
    assert!(
        e.contains(r#"MASTER_ADDR is "node0\u{1b}]0;pwned\u{7}", which is not a host name"#),
        "{e}"
    );
    // The first host of a Slurm node list is checked too.
    let e = error(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NTASKS_PER_NODE", "2"),
        ("SLURM_JOB_NODELIST", "no\u{1b}de[1-2]"),
    ]);
    assert!(e.contains("the first host of SLURM_JOB_NODELIST is"), "{e}");
    assert!(!e.contains('\u{1b}'), "{e:?}");
    // Other values quoted by the messages are cut and escaped as well.
    let e = error(&[("RANK", long), ("WORLD_SIZE", "2")]);
    assert!(
        e.contains("… (100000 bytes), which is not a non-negative"),
        "{e}"
    );
    let e = error(&[("WORLD_SIZE", "4\u{1b}[2J")]);
    assert!(
        e.contains(r"WORLD_SIZE is 4\u{1b}[2J but RANK is not set"),
        "{e}"
    );
}
