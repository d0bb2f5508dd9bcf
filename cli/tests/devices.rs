//! `polychip devices` as an operator runs it: the bundled plugins next to the
//! binary, plugins from `POLYCHIP_PLUGIN_PATH`, and files that fail to load.

mod common;

use std::process::Command;

fn polychip(args: &[&str], plugin_path: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polychip"));
    cmd.args(args)
        .env_remove("POLYCHIP_NO_BUNDLED_PLUGINS")
        .env_remove("POLYCHIP_PLUGIN_PATH");
    if let Some(p) = plugin_path {
        cmd.env("POLYCHIP_PLUGIN_PATH", p);
    }
    let out = cmd.output().expect("run polychip");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn lists_every_device_of_both_bundled_plugins() {
    let (ok, text) = polychip(&["devices"], None);
    assert!(ok, "{text}");
    let header = text.lines().next().unwrap();
    for column in [
        "device",
        "name",
        "memory",
        "f32 FLOP/s",
        "memory kind",
        "ABI",
        "ops",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(text.contains("Ferrite:0  Ferrite F1"), "{text}");
    assert!(text.contains("Ferrite:1  Ferrite F1"), "{text}");
    let cobalt = text
        .lines()
        .find(|l| l.starts_with("Cobalt:0"))
        .expect("a Cobalt row");
    assert!(
        cobalt.contains("private")
            && cobalt.contains(&abi_version())
            && cobalt.contains(&format!("{0}/{0}", polychip_host::ffi::OP_COUNT)),
        "{cobalt}"
    );
}

/// The ABI version the bundled plugins are built for: this header's.
fn abi_version() -> String {
    use polychip_plugin_sdk::abi::{POLYCHIP_ABI_MAJOR, POLYCHIP_ABI_MINOR};
    format!("{POLYCHIP_ABI_MAJOR}.{POLYCHIP_ABI_MINOR}")
}

#[test]
fn json_describes_devices_for_machines() {
    let (ok, text) = polychip(&["devices", "--json"], None);
    assert!(ok, "{text}");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let devices = doc["devices"].as_array().unwrap();
    let ferrite = devices
        .iter()
        .find(|d| d["id"] == "Ferrite:0")
        .expect("Ferrite:0");
    assert_eq!(ferrite["host_visible"], true);
    assert_eq!(ferrite["abi_version"], abi_version().as_str());
    assert!(ferrite["peak_flops"]["f32"].as_f64().unwrap() > 0.0);
    assert!(ferrite["memory_bytes"].as_u64().unwrap() > 0);
    let cobalt = devices
        .iter()
        .find(|d| d["id"] == "Cobalt:0")
        .expect("Cobalt:0");
    assert_eq!(cobalt["host_visible"], false);
    assert_eq!(cobalt["ops_missing"].as_array().unwrap().len(), 0);
    assert_eq!(doc["failures"].as_array().unwrap().len(), 0);
    // The bundled plugins leave the process as they found it (ABI rules 12
    // and 13).
    for plugin in doc["plugins"].as_array().unwrap() {
        assert_eq!(plugin["load_findings"], serde_json::json!([]), "{plugin}");
        assert_eq!(plugin["load_notes"], serde_json::json!([]), "{plugin}");
    }
    assert!(doc["plugins"].as_array().unwrap().len() >= 2, "{doc}");
}

#[test]
fn a_plugin_that_fails_gets_a_line_and_the_others_still_show() {
    let dir = std::env::temp_dir().join(format!("polychip-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("libbogus.so");
    std::fs::write(&bogus, "not a library").unwrap();
    let (ok, text) = polychip(&["devices"], Some(bogus.to_str().unwrap()));
    assert!(!ok, "a failed plugin makes the exit status non-zero");
    assert!(text.contains("Ferrite:0"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("failed to load:"))
        .expect("a failure line");
    assert!(
        line.contains("libbogus.so: not a loadable shared library"),
        "{line}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A scratch directory for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("devices-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `polychip devices` with `env`, timed: exit status, output, seconds.
fn devices_timed(env: &[(&str, &str)]) -> (Option<i32>, String, f64) {
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("devices")
        .env_remove("POLYCHIP_NO_BUNDLED_PLUGINS")
        .env_remove("POLYCHIP_PLUGIN_PATH")
        .envs(env.iter().copied())
        .output()
        .expect("run polychip");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text, started.elapsed().as_secs_f64())
}

fn failure_line<'a>(text: &'a str, file: &std::path::Path) -> &'a str {
    let name = file.display().to_string();
    text.lines()
        .find(|l| l.starts_with("failed to load:") && l.contains(&name))
        .unwrap_or_else(|| panic!("no failure line naming {name}:\n{text}"))
}

#[test]
fn plugins_that_crash_or_hang_while_loading_are_named_and_the_others_still_show() {
    let dir = scratch("broken");
    let mut listed = Vec::new();
    let mut expected = Vec::new();
    for (variant, what) in [
        (
            "BROKEN_INIT_SEGV",
            "crashed while loading (signal 11, SIGSEGV)",
        ),
        (
            "BROKEN_INIT_ABORT",
            "crashed while loading (signal 6, SIGABRT)",
        ),
        (
            "BROKEN_CTOR_SEGV",
            "crashed while loading (signal 11, SIGSEGV)",
        ),
        ("BROKEN_INIT_HANG", "did not finish loading within 8 s"),
    ] {
        let path = common::broken_plugin(variant);
        listed.push(path.display().to_string());
        expected.push((path, what));
    }
    // A real plugin cut short: the loader maps pages the file no longer has.
    let ferrite = common::built_plugin("libpolychip_vendor_ferrite.so");
    let truncated = dir.join("libtruncated.so");
    let bytes = std::fs::read(&ferrite).unwrap();
    std::fs::write(&truncated, &bytes[..100_000]).unwrap();
    listed.push(truncated.display().to_string());
    expected.push((truncated, "crashed while loading (signal 7, SIGBUS)"));
    let fifo = dir.join("libfifo.so");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    listed.push(fifo.display().to_string());
    expected.push((fifo, "it is a FIFO, not a regular file"));
    listed.push("/dev/zero".into());
    expected.push((
        "/dev/zero".into(),
        "it is a character device, not a regular file",
    ));
    // A directory of plugins holding a directory named like one.
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(plugins.join("libdir.so")).unwrap();
    listed.push(plugins.display().to_string());
    expected.push((
        plugins.join("libdir.so"),
        "it is a directory, not a regular file",
    ));

    let path = listed.join(":");
    let (code, text, seconds) = devices_timed(&[
        ("POLYCHIP_PLUGIN_PATH", &path),
        // Every probe has the deadline, the real plugins' too, started
        // at once on a machine that may be loaded: 8 s, not 2.
        ("POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS", "8"),
    ]);
    assert_eq!(
        code,
        Some(1),
        "failed plugins make the exit status 1:\n{text}"
    );
    assert!(
        seconds < 45.0,
        "the probes run at once under one deadline: {seconds} s"
    );
    for (file, what) in &expected {
        let line = failure_line(&text, file);
        assert!(line.contains(what), "{line}");
    }
    assert!(text.contains("Ferrite:0  Ferrite F1"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("Cobalt:0")), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn one_library_under_several_names_is_listed_once() {
    let dir = scratch("aliases");
    let cobalt = common::built_plugin("libpolychip_vendor_cobalt.so");
    let symlink = dir.join("libcobalt-symlink.so");
    let hard = dir.join("libcobalt-hard.so");
    std::os::unix::fs::symlink(&cobalt, &symlink).unwrap();
    std::fs::hard_link(&cobalt, &hard).unwrap();
    let path = format!(
        "{}:{}:{}:{}",
        symlink.display(),
        hard.display(),
        hard.display(),
        cobalt
    );
    let (code, text, _) = devices_timed(&[("POLYCHIP_PLUGIN_PATH", &path)]);
    assert_eq!(code, Some(0), "{text}");
    let rows = text.lines().filter(|l| l.starts_with("Cobalt:")).count();
    assert_eq!(rows, 1, "one Cobalt device, listed once:\n{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_world_writable_plugin_directory_gets_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("world-writable");
    let cobalt = common::built_plugin("libpolychip_vendor_cobalt.so");
    std::os::unix::fs::symlink(&cobalt, dir.join("libcobalt.so")).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, text, _) = devices_timed(&[("POLYCHIP_PLUGIN_PATH", dir.to_str().unwrap())]);
    assert_eq!(code, Some(0), "a warning is not a failure:\n{text}");
    let warning = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains(dir.to_str().unwrap()))
        .unwrap_or_else(|| panic!("no warning naming the directory:\n{text}"));
    assert!(
        warning.contains("is world-writable (mode 0777)")
            && warning.contains("another user could add a plugin"),
        "{warning}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_nonsense_load_deadline_is_refused_naming_the_variable() {
    for bad in ["abc", "0", "-3", "inf"] {
        let (code, text, _) = devices_timed(&[("POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS", bad)]);
        assert_eq!(code, Some(2), "{text}");
        assert!(
            text.contains(&format!("POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS={bad:?}")),
            "{text}"
        );
    }
}

#[test]
fn a_plugin_owned_by_another_user_gets_a_warning() {
    let dir = scratch("foreign-owner");
    let cobalt = common::built_plugin("libpolychip_vendor_cobalt.so");
    let copy = dir.join("libforeign.so");
    std::fs::copy(&cobalt, &copy).unwrap();
    if std::os::unix::fs::chown(&copy, Some(54_321), None).is_err() {
        eprintln!("skipped: changing a file's owner needs root");
        return;
    }
    let (code, text, _) = devices_timed(&[("POLYCHIP_PLUGIN_PATH", copy.to_str().unwrap())]);
    assert_eq!(code, Some(0), "a warning is not a failure:\n{text}");
    let warning = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains(copy.to_str().unwrap()))
        .unwrap_or_else(|| panic!("no warning naming the file:\n{text}"));
    assert!(
        warning.contains("the file is owned by another user (uid 54321)")
            && warning.contains("another user could replace this plugin's code"),
        "{warning}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
