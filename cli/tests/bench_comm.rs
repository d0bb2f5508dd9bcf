//! `polychip bench comm` as a user runs it: alone (it starts two local ranks
//! itself), three operations at two small sizes, it exits 0 within seconds
//! and prints the nccl-tests header and one row per operation and size,
//! each with `#wrong` 0, without the launcher's `[rank 0]` prefix.
//! `--iters 200` keeps a debug build (about 100x slower per call) quick.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn bench_comm_prints_correct_rows() {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(["bench", "comm", "--sizes", "4096,65536"])
        .args(["--ops", "all_reduce,all_gather,broadcast"])
        // Debug builds are ~100x slower per call than release: few
        // iterations keep the test at a few seconds in either profile.
        .args(["--iters", "200"])
        .env_remove("RANK")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("POLYCHIP_BENCH_RANKS")
        .stdin(Stdio::null())
        .output()
        .expect("run polychip bench comm");
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(elapsed < Duration::from_secs(120), "took {elapsed:?}");
    let header = stdout
        .lines()
        .find(|l| l.contains("size(B)"))
        .unwrap_or_else(|| panic!("no header in:\n{stdout}"));
    for column in [
        "count",
        "type",
        "redop",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "#wrong",
    ] {
        assert!(header.contains(column), "{column} missing from {header:?}");
    }
    assert!(!stdout.contains("[rank"), "launcher prefix in:\n{stdout}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("size(B)"))
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| !f.is_empty())
        .collect();
    assert_eq!(rows.len(), 6, "3 ops x 2 sizes expected in:\n{stdout}");
    for op in ["all_reduce", "all_gather", "broadcast"] {
        assert!(
            stdout.contains(&format!("# {op}")),
            "{op} missing:\n{stdout}"
        );
    }
    for row in &rows {
        assert_eq!(row.len(), 9, "{row:?}");
        assert!(["4096", "65536"].contains(&row[0]), "{row:?}");
        assert_eq!(row[2], "float");
        assert_eq!(row[4], "200", "{row:?}");
        assert_eq!(row[8], "0", "wrong elements in {row:?}");
        let time: f64 = row[5].parse().expect("time");
        assert!(time > 0.0, "{row:?}");
    }
}
