//! `polychip-spec`: regenerates the files derived from `spec/ops.toml`
//! (`--check`: only says which are stale, exiting 1 if any is).

use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("polychip-spec: unknown argument {other:?}; usage: polychip-spec [--check]");
            return ExitCode::from(2);
        }
    };
    let root = polychip_spec::workspace_root();
    let result = if check {
        polychip_spec::stale(&root).map(|s| s.into_iter().map(|(p, _)| p).collect::<Vec<_>>())
    } else {
        polychip_spec::write(&root)
    };
    match result {
        Err(e) => {
            eprintln!("polychip-spec: {e}");
            ExitCode::FAILURE
        }
        Ok(paths) if paths.is_empty() => {
            println!("every file derived from spec/ops.toml is fresh");
            ExitCode::SUCCESS
        }
        Ok(paths) => {
            let verb = if check { "stale" } else { "written" };
            for p in &paths {
                println!("{verb}: {}", p.strip_prefix(&root).unwrap_or(p).display());
            }
            if check {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
