//! Plugins log through the host's callback: records from a C plugin
//! (`host->log`) and from a Rust plugin (the `log` crate, forwarded by the
//! SDK) arrive in the host process's logger, tagged with the plugin's file.

mod common;

use std::sync::Mutex;

use polychip_host::{LoadOptions, Runtime};

static RECORDS: Mutex<Vec<(log::Level, String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        RECORDS.lock().unwrap().push((
            record.level(),
            record.target().to_string(),
            record.args().to_string(),
        ));
    }
    fn flush(&self) {}
}

/// Installs [`Capture`] once for the tests of this file.
fn capture() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(log::LevelFilter::Debug);
    });
}

#[test]
fn plugin_log_records_reach_the_host_logger() {
    capture();
    let runtime = Runtime::load(
        &[common::cobalt_path(), common::ferrite_path()],
        &LoadOptions::default(),
    );
    assert!(runtime.failures().is_empty(), "{:?}", runtime.failures());
    let cobalt = &runtime.devices_of("cobalt")[0];
    drop(cobalt.alloc(4096).unwrap());
    let records = RECORDS.lock().unwrap();
    let from = |file: &str| {
        records
            .iter()
            .filter(|(_, target, message)| {
                target == "polychip::plugin" && message.starts_with(&format!("{file}: "))
            })
            .count()
    };
    assert!(
        from("libpolychip_vendor_cobalt.so") > 0,
        "no Cobalt records in {records:?}"
    );
    let ferrite_info = records.iter().any(|(level, _, m)| {
        *level == log::Level::Info && m.starts_with("libpolychip_vendor_ferrite.so: Ferrite 1.0.0:")
    });
    assert!(ferrite_info, "no Ferrite record in {records:?}");
}

#[test]
fn rust_plugins_export_only_the_entry_symbol() {
    for (name, path) in [
        ("Ferrite", common::ferrite_path()),
        ("OpenCL", common::opencl_path()),
    ] {
        let Ok(out) = std::process::Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(&path)
            .output()
        else {
            eprintln!("skipped: nm is not installed (scripts/install-deps installs binutils)");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let functions: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                let (_, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
                (kind == "T").then_some(name)
            })
            .collect();
        assert_eq!(
            functions,
            ["polychip_plugin_init_v1"],
            "{name} exports: {text}"
        );
    }
}

/// A plugin's record reaches the logger with its control characters
/// escaped and cut at 64 KiB, saying how long it was (until 2026-12-06 its
/// terminal escapes reached stderr as they were, and 4 MiB were copied
/// whole).
#[test]
fn a_plugin_record_with_terminal_escapes_and_no_end_is_escaped_and_cut() {
    capture();
    let device = common::first_device(&common::fake_plugin(Some("FAKE_FILL_LONG_ERROR")));
    let t = device.zeros(polychip_host::DType::F32, &[4]).unwrap();
    let error = device.exec().fill(&t, 1.0).unwrap_err().to_string();
    assert!(
        error.contains("fake: \u{1b}[31mfill failed"),
        "{}",
        &error[..200]
    );
    let records = RECORDS.lock().unwrap();
    let record = records
        .iter()
        .map(|(_, _, m)| m)
        .find(|m| m.starts_with("libfake_fill_long_error.so: "))
        .unwrap_or_else(|| panic!("no record of the plugin among {} records", records.len()));
    assert!(
        record.contains("fake: \\u{1b}[31mfill failed\\u{1b}[0m \\u{1}xxx"),
        "{}",
        &record[..200]
    );
    assert!(!record.chars().any(char::is_control), "{}", &record[..200]);
    assert!(record.len() < 65536 + 200, "{} bytes", record.len());
    assert!(
        record.ends_with("... (the plugin's message is 4194304 bytes; the first 65536 are kept)"),
        "{}",
        &record[record.len() - 200..]
    );
}
