//! Builds the Cobalt plugin as part of the ordinary `cargo build`.
//!
//! `cc::Build` only makes static archives, so this script asks the `cc` crate
//! for the C compiler (honouring `CC`, `CFLAGS` and cross-compilation
//! settings) and links every `src-c/*.c` file into the shared library
//! `libpolychip_vendor_cobalt.so` itself, with hidden visibility so that the
//! entry symbol is the only export. The library goes to `OUT_DIR` (its path
//! reaches the crate as `POLYCHIP_COBALT_LIBRARY`) and is also copied into the
//! cargo profile directory (`target/debug/` or `target/release/`), next to
//! the `polychip` binary. A C compiler error fails the build and shows the
//! compiler's output.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The flags the plugin is held to: strict C11, no warnings, only the entry
/// symbol visible.
const CFLAGS: &[&str] = &[
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pedantic",
    "-O2",
];

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let workspace_dir = manifest_dir
        .ancestors()
        .nth(2)
        .expect("the crate lives at <workspace>/vendor-stubs/cobalt");
    let include_dir = workspace_dir.join("include");
    let source_dir = manifest_dir.join("src-c");

    println!("cargo:rerun-if-changed=build.rs");
    println!(
        "cargo:rerun-if-changed={}",
        include_dir.join("polychip.h").display()
    );
    println!("cargo:rerun-if-changed={}", source_dir.display());
    let sources = c_sources(&source_dir);
    for path in fs::read_dir(&source_dir).expect("read src-c").flatten() {
        println!("cargo:rerun-if-changed={}", path.path().display());
    }

    let file_name = if target_os == "macos" {
        "libpolychip_vendor_cobalt.dylib"
    } else {
        "libpolychip_vendor_cobalt.so"
    };
    let library = out_dir.join(file_name);

    let compiler = cc::Build::new().get_compiler();
    let mut command = compiler.to_command();
    command.args(CFLAGS);
    if let Some(flag) = steady_branches(&compiler, &out_dir) {
        command.arg(flag);
    }
    command.arg("-I").arg(&include_dir).args(&sources);
    command.arg("-o").arg(&library);
    if target_os == "linux" {
        // Every symbol must resolve (against libc, libm and libpthread only).
        command.arg("-Wl,-z,defs");
    }
    command.args(["-lm", "-lpthread"]);
    run(&mut command);

    copy_to_profile_dir(&library, &out_dir, file_name);
    println!(
        "cargo:rustc-env=POLYCHIP_COBALT_LIBRARY={}",
        library.display()
    );
    // The target triple, for tests that compile C with the same toolchain.
    println!("cargo:rustc-env=POLYCHIP_COBALT_TARGET={target}");
}

/// The `.c` files in `dir`, sorted so the command line is reproducible.
fn c_sources(dir: &Path) -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("read a src-c entry").path())
        .filter(|path| path.extension() == Some(OsStr::new("c")))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "no C sources in {}", dir.display());
    sources
}

/// On x86, the assembler flag that keeps jumps from crossing or ending on
/// a 32-byte boundary, where the assembler takes it (GNU as 2.34 on), else
/// nothing. Intel's JCC erratum microcode makes such a jump slow, so a hot
/// loop's speed turned on where unrelated code placed it: moving a helper
/// into a file of its own, which changed no operator's code, made Cobalt's
/// backward pass 50% slower (13 ms a block to 19-20, with the new scratch
/// cache on or off); with the flag the sources before and after ran at
/// 13.4 and 12.3 ms.
fn steady_branches(compiler: &cc::Tool, out_dir: &Path) -> Option<&'static str> {
    const FLAG: &str = "-Wa,-mbranches-within-32B-boundaries";
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" && arch != "x86" {
        return None;
    }
    let probe = out_dir.join("probe-branches.c");
    fs::write(&probe, "int polychip_probe(int x) { return x ? 1 : 2; }\n").ok()?;
    let ok = compiler
        .to_command()
        .args(["-c", "-Werror", FLAG])
        .arg(&probe)
        .arg("-o")
        .arg(out_dir.join("probe-branches.o"))
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(FLAG)
}

/// Runs the compiler, failing the build with its output when it fails.
fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler ({command:?}): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        eprintln!(
            "compiling the Cobalt plugin failed ({}).\ncommand: {command:?}\n{stdout}{stderr}",
            output.status
        );
        std::process::exit(1);
    }
    for line in stdout.lines().chain(stderr.lines()) {
        println!("cargo:warning={line}");
    }
}

/// Copies the library into the profile directory (the parent of the `build`
/// directory that `OUT_DIR` lies under, e.g. `target/debug/`), through a
/// temporary file and a rename, so a process that has the old copy loaded
/// keeps a valid mapping.
fn copy_to_profile_dir(library: &Path, out_dir: &Path, file_name: &str) {
    let Some(profile_dir) = out_dir
        .ancestors()
        .find(|dir| dir.file_name() == Some(OsStr::new("build")))
        .and_then(Path::parent)
    else {
        println!(
            "cargo:warning=OUT_DIR {} is not under a cargo `build` directory; \
             not copying {file_name} next to the binaries",
            out_dir.display()
        );
        return;
    };
    let destination = profile_dir.join(file_name);
    let temporary = profile_dir.join(format!("{file_name}.tmp{}", std::process::id()));
    fs::copy(library, &temporary)
        .and_then(|_| fs::rename(&temporary, &destination))
        .unwrap_or_else(|e| {
            panic!(
                "cannot copy {} to {}: {e}",
                library.display(),
                destination.display()
            )
        });
}
