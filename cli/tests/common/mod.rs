//! Runs the `polychip` binary under test (shared by the CLI's test files).

use std::process::Command;

/// `polychip ARGS` with the extra environment `env` and the shared-memory
/// transport: its exit code, stdout and stderr.
#[allow(dead_code)]
pub fn polychip_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(args)
        .envs(env.iter().copied())
        .env("POLYCHIP_TRANSPORT", "shm")
        .output()
        .expect("run polychip");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `polychip ARGS`.
#[allow(dead_code)] // not every test file needs both
pub fn polychip(args: &[&str]) -> (Option<i32>, String, String) {
    polychip_env(args, &[])
}

/// The path of a plugin the workspace built beside the binary under test.
#[allow(dead_code)]
pub fn built_plugin(name: &str) -> String {
    let dir = std::path::PathBuf::from(env!("CARGO_BIN_EXE_polychip"))
        .parent()
        .unwrap()
        .to_path_buf();
    for p in [dir.join(name), dir.join("deps").join(name)] {
        if p.exists() {
            return p.display().to_string();
        }
    }
    panic!("{name} is not built: run `cargo build --workspace` first");
}

/// `polychip conform ARGS --json FILE` with the extra environment `env`:
/// its exit status, stdout and stderr together, and the JSON report (Null
/// when none was written).
#[allow(dead_code)]
pub fn conform_report(args: &[&str], env: &[(&str, &str)]) -> (i32, String, serde_json::Value) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let json = std::env::temp_dir().join(format!("conform-{}-{n}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("conform")
        .args(args)
        .arg("--json")
        .arg(&json)
        .envs(env.iter().copied())
        .output()
        .expect("run polychip conform");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let doc = std::fs::read_to_string(&json)
        .map(|s| serde_json::from_str(&s).expect("valid JSON report"))
        .unwrap_or(serde_json::Value::Null);
    std::fs::remove_file(&json).ok();
    (out.status.code().unwrap_or(-1), text, doc)
}

/// A conformance report (`doc`, of plugin `name`) with no failure, every
/// operator of the ABI tested, each (operator, dtype) implemented and
/// running a case at least.
#[allow(dead_code)]
pub fn assert_passes_every_operator(name: &str, doc: &serde_json::Value) {
    assert_eq!(doc["failures"].as_array().unwrap().len(), 0, "{name}");
    let rows = doc["rows"].as_array().unwrap();
    let ops: std::collections::HashSet<&str> =
        rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops.len(),
        polychip_host::ffi::OP_COUNT,
        "{name}: every operator of the ABI is tested"
    );
    for r in rows {
        assert_eq!(
            r["not_implemented"], 0,
            "{name} implements {} {}",
            r["op"], r["dtype"]
        );
        assert!(
            r["passed"].as_u64().unwrap() > 0,
            "{name}: {} {} ran no case",
            r["op"],
            r["dtype"]
        );
    }
}

/// Compiles `tests/c/broken_plugin.c` with `-D<variant>` into a plugin (once
/// per variant and test process), under the test's scratch directory.
#[allow(dead_code)]
pub fn broken_plugin(variant: &str) -> std::path::PathBuf {
    c_plugin("broken_plugin", variant)
}

/// Compiles `tests/c/fake_plugin.c` (a working plugin with one host-memory
/// device and `fill`, which each variant breaks in one way) with
/// `-D<variant>`, as [`broken_plugin`].
#[allow(dead_code)]
pub fn fake_plugin(variant: &str) -> std::path::PathBuf {
    c_plugin("fake_plugin", variant)
}

/// Compiles `tests/c/<source>.c` with `-D<variant>` into
/// `<scratch>/<source>s/lib<variant>.so`.
fn c_plugin(source: &str, variant: &str) -> std::path::PathBuf {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{source}s"));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("lib{}.so", variant.to_lowercase()));
    let tmp = dir.join(format!(
        "lib{}.so.{}.tmp",
        variant.to_lowercase(),
        std::process::id()
    ));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&compiler)
        .args([
            "-std=c11",
            "-O0",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-I",
        ])
        .arg(root.join("include"))
        .arg(root.join(format!("tests/c/{source}.c")))
        .arg(format!("-D{variant}"))
        // libm, for the fake plugin's variants.
        .arg("-lm")
        .arg("-o")
        .arg(&tmp)
        .output()
        .unwrap_or_else(|e| panic!("run the C compiler {compiler}: {e}"));
    assert!(
        output.status.success(),
        "compiling {source} {variant}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&tmp, &out).expect("move the plugin into place");
    out
}

/// The largest |a[i] - b[i]| of two loss curves of one length.
#[allow(dead_code)]
pub fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A fresh, empty scratch directory `polychip-{suite}-{pid}-{name}` in the
/// temporary directory (whatever an earlier run left there removed).
#[allow(dead_code)]
pub fn scratch_dir(suite: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("polychip-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether this test can run commands as `nobody` under a process limit
/// (`setpriv --reuid 65534 ... prlimit --nproc=N`: root, setpriv and
/// prlimit); says it skips when it cannot.
#[allow(dead_code)]
pub fn can_limit_processes() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let tools = ["setpriv", "prlimit"]
        .iter()
        .all(|t| Command::new(t).arg("--version").output().is_ok());
    if !root || !tools {
        eprintln!(
            "skipped: needs root, setpriv and prlimit to run as nobody under a process limit"
        );
    }
    root && tools
}
