//! Checks on the built plugin library itself: it exports nothing but the
//! entry symbol, and the build script placed a copy next to the workspace's
//! binaries.

use std::path::Path;
use std::process::Command;

use polychip_vendor_cobalt::LIBRARY_PATH;

/// Symbols some linkers define in every shared library; not the plugin's own.
const LINKER_SYMBOLS: &[&str] = &["_init", "_fini", "_edata", "_end", "__bss_start"];

#[test]
fn only_the_entry_symbol_is_exported() {
    let output = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(LIBRARY_PATH)
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            println!("skipped: cannot run nm ({e})");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "nm -D --defined-only {LIBRARY_PATH} failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // Lines are "address type name"; uppercase types are global.
    let global: Vec<(&str, &str)> = stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_address, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            Some((kind, name))
        })
        .filter(|(kind, name)| {
            kind.chars().all(|c| c.is_ascii_uppercase()) && !LINKER_SYMBOLS.contains(name)
        })
        .collect();
    let functions: Vec<&str> = global
        .iter()
        .filter(|(kind, _)| *kind == "T")
        .map(|(_, name)| *name)
        .collect();
    assert_eq!(
        functions,
        ["polychip_plugin_init_v1"],
        "the plugin must export exactly one function; nm -D says:\n{stdout}"
    );
    assert_eq!(
        global.len(),
        1,
        "the plugin exports symbols besides its entry point:\n{stdout}"
    );
}

#[test]
fn the_library_is_copied_next_to_the_binaries() {
    // This test runs from <profile dir>/deps/, next to where the build script
    // copies the library.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in <profile dir>/deps");
    let file_name = Path::new(LIBRARY_PATH)
        .file_name()
        .expect("LIBRARY_PATH names a file");
    let copy = profile_dir.join(file_name);
    let built = std::fs::read(LIBRARY_PATH).expect("read the built library");
    let copied = std::fs::read(&copy)
        .unwrap_or_else(|e| panic!("no copy of the plugin at {}: {e}", copy.display()));
    assert!(
        built == copied,
        "{} differs from {LIBRARY_PATH}",
        copy.display()
    );
}
