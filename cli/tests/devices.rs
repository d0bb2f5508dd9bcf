//! `polychip devices` as an operator runs it: the bundled plugins next to the
//! binary, plugins from `POLYCHIP_PLUGIN_PATH`, and files that fail to load.

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
            && cobalt.contains("1.1")
            && cobalt.contains(&format!("{0}/{0}", polychip_host::ffi::OP_COUNT)),
        "{cobalt}"
    );
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
    assert_eq!(ferrite["abi_version"], "1.1");
    assert!(ferrite["peak_flops"]["f32"].as_f64().unwrap() > 0.0);
    assert!(ferrite["memory_bytes"].as_u64().unwrap() > 0);
    let cobalt = devices
        .iter()
        .find(|d| d["id"] == "Cobalt:0")
        .expect("Cobalt:0");
    assert_eq!(cobalt["host_visible"], false);
    assert_eq!(cobalt["ops_missing"].as_array().unwrap().len(), 0);
    assert_eq!(doc["failures"].as_array().unwrap().len(), 0);
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
