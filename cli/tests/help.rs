//! `polychip --help` says what the command does today.

use std::process::Command;

#[test]
fn help_describes_every_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("--help")
        .output()
        .expect("run polychip --help");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!text.contains("later release"), "{text}");
    for command in [
        "devices",
        "conform",
        "launch",
        "bench",
        "plan",
        "train",
        "checkpoint",
    ] {
        assert!(
            text.contains(&format!("  {command} ")),
            "{command} missing from:\n{text}"
        );
    }
    assert!(
        text.contains("plan a heterogeneous layout and train across vendors"),
        "{text}"
    );
}
