//! `scripts/install --prefix DIR` lays polychip out for C and C++ users,
//! and a framework's build finds it the usual ways: `pkg-config polychip`
//! and CMake's `find_package(polychip)` build the C example against the
//! installed library, which finds the bundled plugins in
//! `PREFIX/lib/polychip`; the installed `polychip` command finds them too.
//!
//! Needs the workspace built (`cargo build --workspace`) and pkg-config and
//! cmake (`scripts/install-deps` installs both).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{profile_dir, root, run};

/// The cargo profile of this test binary (`debug` or `release`).
fn profile() -> String {
    profile_dir()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn install(prefix: &Path) {
    run(
        Command::new(root().join("scripts/install"))
            .args(["--prefix"])
            .arg(prefix)
            .args(["--profile", &profile(), "--no-build"]),
        "scripts/install",
    );
}

#[test]
fn pkg_config_and_cmake_find_the_installed_library() {
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("install");
    let _ = std::fs::remove_dir_all(&work);
    let prefix = work.join("prefix");
    install(&prefix);
    for file in [
        "lib/libpolychip.so",
        "lib/polychip/libpolychip_vendor_ferrite.so",
        "lib/polychip/libpolychip_vendor_cobalt.so",
        "include/libpolychip.h",
        "include/polychip.h",
        "lib/pkgconfig/polychip.pc",
        "lib/cmake/polychip/polychipConfig.cmake",
        "bin/polychip",
    ] {
        assert!(prefix.join(file).exists(), "{file} is not installed");
    }
    let source = root().join("examples/c/devices.c");

    // pkg-config.
    let flags = run(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "polychip"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
        "pkg-config --cflags --libs polychip",
    );
    let exe = work.join("devices_pkgconfig");
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Werror"])
        .arg(&source)
        .args(flags.split_whitespace())
        .arg("-lm")
        .arg("-o")
        .arg(&exe);
    run(&mut cc, "cc with pkg-config's flags");
    let out = run(&mut Command::new(&exe), "the pkg-config build");
    assert!(
        out.contains("Cobalt") && out.contains("Ferrite") && out.ends_with("ok\n"),
        "{out}"
    );

    // CMake.
    let project = work.join("cmake");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.16)\nproject(consumer C)\n\
             find_package(polychip 0.1 REQUIRED)\n\
             add_executable(devices \"{}\")\n\
             target_link_libraries(devices PRIVATE polychip::polychip m)\n",
            source.display()
        ),
    )
    .unwrap();
    let build = work.join("cmake-build");
    run(
        Command::new("cmake")
            .arg("-S")
            .arg(&project)
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())),
        "cmake configure",
    );
    run(
        Command::new("cmake").arg("--build").arg(&build),
        "cmake --build",
    );
    let out = run(&mut Command::new(build.join("devices")), "the CMake build");
    assert!(out.ends_with("ok\n"), "{out}");

    // The installed command finds the plugins in PREFIX/lib/polychip.
    let out = run(
        Command::new(prefix.join("bin/polychip")).arg("devices"),
        "the installed polychip devices",
    );
    assert!(out.contains("Ferrite") && out.contains("Cobalt"), "{out}");
}
