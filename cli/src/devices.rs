//! `polychip devices`: a table (or JSON) of every device of every plugin
//! found through `POLYCHIP_PLUGIN_PATH` and the bundled location, and one
//! line per plugin that failed to load. Exits 1 when any plugin failed.
//!
//! Each plugin file is first loaded in a child process (`polychip devices
//! --probe FILE`) with a deadline (`POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS`,
//! default 10 s): one that crashes or hangs while loading is reported by
//! name and the others are listed (see `polychip_host::probe`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use polychip_files::printable_lines;
use polychip_host::probe::{Probe, REFUSED_EXIT};
use polychip_host::{Device, LoadOptions, Runtime};
use serde_json::{Value, json};

/// Options of `polychip devices`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Internal: load this one plugin file and exit (0: loaded, 3: refused);
    /// the child process that keeps a crashing plugin out of the caller.
    #[arg(long, hide = true, value_name = "FILE")]
    probe: Option<PathBuf>,
}

/// The probe that loads plugin files in child processes of this program:
/// `polychip devices --probe FILE`, with the deadline from the environment.
pub fn probe() -> Result<Probe, String> {
    let exe = std::env::current_exe().map_err(|e| {
        format!("cannot find the polychip executable to load plugins in a child process: {e}")
    })?;
    Probe::from_env(
        exe,
        vec![OsString::from("devices"), OsString::from("--probe")],
    )
}

/// Every plugin [`Runtime::from_env`] would load, each first loaded in a
/// child process so that one that crashes or hangs becomes a failure.
pub fn runtime_from_env() -> Result<Runtime, String> {
    Ok(Runtime::from_env_probed(&probe()?))
}

/// The probe child: load `file` in this process and exit.
fn probe_one(file: &Path) -> ExitCode {
    let runtime = Runtime::load(&[file], &LoadOptions::default());
    match runtime.failures().first() {
        None => ExitCode::SUCCESS,
        Some(f) => {
            eprintln!("{}", f.error);
            ExitCode::from(REFUSED_EXIT as u8)
        }
    }
}

fn memory_kind(device: &Device) -> &'static str {
    let props = device.props();
    match (props.host_visible, props.rdma_exportable) {
        (true, true) => "host-visible, RDMA",
        (true, false) => "host-visible",
        (false, true) => "private, RDMA",
        (false, false) => "private",
    }
}

/// Memory in GiB, or in MiB below a tenth of a GiB (a 1 MiB device
/// showed as "0.00 GiB").
fn gib(bytes: u64) -> String {
    if bytes < (1u64 << 30) / 10 {
        return format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64);
    }
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// FLOP/s with a unit that keeps three significant digits readable.
fn flops(value: f64) -> String {
    let (scaled, unit) = if value >= 1e12 {
        (value / 1e12, "T")
    } else {
        (value / 1e9, "G")
    };
    let digits = if scaled >= 100.0 {
        0
    } else if scaled >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.digits$} {unit}")
}

fn device_json(device: &Device) -> Value {
    let p = device.props();
    let plugin = device.plugin();
    let (major, minor) = plugin.abi_version();
    let ops = plugin.ops();
    json!({
        "id": device.to_string(),
        "vendor": plugin.vendor(),
        "plugin_version": plugin.version(),
        "plugin_path": plugin.path().display().to_string(),
        "abi_version": format!("{major}.{minor}"),
        "index": device.index(),
        "name": p.name,
        "memory_bytes": p.memory_bytes,
        "host_visible": p.host_visible,
        "rdma_exportable": p.rdma_exportable,
        "compute_units": p.compute_units,
        "peak_flops": { "f32": p.peak_flops_f32, "bf16": p.peak_flops_bf16, "f16": p.peak_flops_f16 },
        "memory_bandwidth": p.memory_bandwidth,
        "link_bandwidth": p.link_bandwidth,
        "ops_implemented": ops.implemented(),
        "ops_missing": ops.missing(),
    })
}

fn print_table(runtime: &Runtime) {
    let header = [
        "device",
        "name",
        "memory",
        "f32 FLOP/s",
        "bf16",
        "f16",
        "memory kind",
        "ABI",
        "ops",
    ];
    let mut rows = vec![header.map(String::from).to_vec()];
    for d in runtime.devices() {
        let p = d.props();
        let (major, minor) = d.plugin().abi_version();
        let ops = d.plugin().ops();
        rows.push(vec![
            d.to_string(),
            p.name.clone(),
            gib(p.memory_bytes),
            flops(p.peak_flops_f32),
            flops(p.peak_flops_bf16),
            flops(p.peak_flops_f16),
            memory_kind(d).to_string(),
            format!("{major}.{minor}"),
            format!("{}/{}", ops.implemented().len(), ops.total()),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if runtime.devices().is_empty() && runtime.plugins().is_empty() {
        println!(
            "(no devices: no plugin loaded; set POLYCHIP_PLUGIN_PATH or build the bundled plugins with `cargo build --workspace`)"
        );
    }
    for plugin in runtime.plugins() {
        if plugin.devices().is_empty() {
            println!(
                "note: {} ({}) loaded but reports no devices; its warning on stderr says why",
                plugin.vendor(),
                polychip_files::shown_path(plugin.path())
            );
        }
        let missing = plugin.ops().missing();
        if !missing.is_empty() {
            println!(
                "note: {} does not implement: {}",
                plugin.vendor(),
                missing.join(", ")
            );
        }
        // ABI rules 12 and 13: what loading it changed in the process.
        for finding in plugin.load_findings() {
            println!("warning: {finding}");
        }
        for note in plugin.load_notes() {
            println!("note: {note}");
        }
    }
    for failure in runtime.failures() {
        println!("failed to load: {}", failure.error);
    }
}

/// Runs the subcommand.
pub fn run(args: &Args) -> ExitCode {
    if let Some(file) = &args.probe {
        return probe_one(file);
    }
    let runtime = match runtime_from_env() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("polychip devices: {}", printable_lines(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    if args.json {
        let doc = json!({
            "devices": runtime.devices().iter().map(device_json).collect::<Vec<_>>(),
            "plugins": runtime.plugins().iter().map(|p| json!({
                "path": p.path().display().to_string(),
                "vendor": p.vendor(),
                "version": p.version(),
                "load_findings": p.load_findings(),
                "load_notes": p.load_notes(),
            })).collect::<Vec<_>>(),
            "failures": runtime.failures().iter().map(|f| json!({
                "path": f.path.display().to_string(),
                "error": f.error.to_string(),
            })).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON values serialize")
        );
    } else {
        print_table(&runtime);
    }
    if runtime.failures().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_memories_are_shown_in_mib() {
        assert_eq!(super::gib(1 << 20), "1.00 MiB");
        assert_eq!(super::gib(64 << 20), "64.00 MiB");
        assert_eq!(super::gib(8 << 30), "8.00 GiB");
    }
}
