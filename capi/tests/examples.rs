//! The C API from C and C++ as a framework uses it: the header compiles as
//! strict C11 and as C++17, every struct has the same layout from C as from
//! Rust (and the DLPack structs the same as DLPack's own), and the programs
//! in `examples/c` and `examples/cpp` build against libpolychip and run:
//! devices of both bundled vendors, a tensor moved between them, a matmul,
//! DLPack out and back, errors, and an all-reduce over two ranks under
//! `polychip launch`.
//!
//! Needs the workspace built first (`cargo build --workspace`, as
//! `scripts/test` does): libpolychip, the bundled plugins and `polychip`.

use std::path::{Path, PathBuf};
use std::process::Command;

use polychip::*;

mod common;
use common::{profile_dir, root, run};

fn built(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace`)",
        path.display()
    );
    path
}

/// Compiles `sources` into `exe` with the C (`cpp` false) or C++ compiler,
/// warnings as errors, linked to libpolychip.
fn compile(cpp: bool, sources: &[PathBuf], exe: &Path, link: bool) {
    built("libpolychip.so");
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .cpp(cpp)
        .opt_level(0)
        .target(env!("TARGET_TRIPLE"))
        .host(env!("TARGET_TRIPLE"))
        .get_compiler();
    let standard = if cpp { "-std=c++17" } else { "-std=c11" };
    let mut cmd = compiler.to_command();
    cmd.args([standard, "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(root().join("include"))
        .args(sources)
        .arg("-o")
        .arg(exe);
    if link {
        let dir = profile_dir();
        cmd.arg(format!("-L{}", dir.display()))
            .arg("-lpolychip")
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lm");
    }
    let output = cmd.output().expect("run the compiler");
    assert!(
        output.status.success(),
        "{} does not compile ({standard}):\n{}",
        sources[0].display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("capi")
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_c_example_lists_moves_multiplies_and_reports_errors() {
    let dir = scratch("c");
    let exe = dir.join("devices");
    compile(false, &[root().join("examples/c/devices.c")], &exe, true);
    let out = run(&mut Command::new(&exe), "examples/c/devices.c");
    assert!(out.contains("Ferrite") && out.contains("Cobalt"), "{out}");
    assert!(out.contains("a @ b = [[6, 6], [15, 15]]"), "{out}");
    assert!(out.contains("refused: polychip_op_matmul: "), "{out}");
    assert!(
        out.contains("is not a live polychip_tensor_t (it was destroyed)"),
        "{out}"
    );
    assert!(out.ends_with("ok\n"), "{out}");
}

#[test]
fn the_cpp_example_runs_with_raii_and_dlpack() {
    let dir = scratch("cpp");
    let exe = dir.join("devices_cpp");
    compile(true, &[root().join("examples/cpp/devices.cpp")], &exe, true);
    let out = run(&mut Command::new(&exe), "examples/cpp/devices.cpp");
    assert!(out.contains("DLPack round trip shares"), "{out}");
    assert!(out.contains("refused (code "), "{out}");
    assert!(out.ends_with("ok\n"), "{out}");
}

#[test]
fn two_ranks_all_reduce_through_the_c_api() {
    let dir = scratch("allreduce");
    let exe = dir.join("allreduce");
    compile(false, &[root().join("examples/c/allreduce.c")], &exe, true);
    let out = run(
        Command::new(built("polychip"))
            .args(["launch", "-n", "2", "--"])
            .arg(&exe),
        "polychip launch -n 2 -- allreduce",
    );
    assert_eq!(out.matches("all-reduce sum 3 ok").count(), 2, "{out}");
    assert!(out.contains("Ferrite") && out.contains("Cobalt"), "{out}");
}

/// `(name, size, [(field, offset)])` of every struct, seen from Rust.
macro_rules! layouts {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {
        vec![$((
            stringify!($ty),
            std::mem::size_of::<$ty>(),
            vec![$((stringify!($field), std::mem::offset_of!($ty, $field))),*],
        )),*]
    };
}

#[test]
fn the_header_compiles_as_c11_and_cpp17_with_rusts_layouts() {
    let rust = layouts! {
        polychip_runtime_options_t { struct_size, api_major, api_minor, plugin_path, bundled, strict, log, log_context, log_level }
        polychip_device_info_t { struct_size, vendor, name, plugin_path, plugin_version, plugin_device, abi_major, abi_minor, ops_implemented, ops_total, memory_bytes, host_visible, rdma_exportable, compute_units, peak_flops_f32, peak_flops_bf16, peak_flops_f16, memory_bandwidth, link_bandwidth }
        polychip_tensor_info_t { struct_size, device, dtype, ndim, shape, strides, data, byte_offset, numel, contiguous }
        polychip_comm_options_t { struct_size, rank, world_size, master_addr, master_port }
        polychip_dlpack_device_t { device_type, device_id }
        polychip_dlpack_dtype_t { code, bits, lanes }
        polychip_dlpack_tensor_t { data, device, ndim, dtype, shape, strides, byte_offset }
        polychip_dlpack_version_t { major, minor }
        polychip_dlpack_versioned_t { version, manager_ctx, deleter, flags, dl_tensor }
        polychip_dlpack_managed_t { dl_tensor, manager_ctx, deleter }
    };
    // Static assertions: a C or C++ compiler refuses the file if one fails.
    let mut checks = String::new();
    for (ty, size, fields) in &rust {
        checks.push_str(&format!("POLYCHIP_CHECK(sizeof({ty}) == {size});\n"));
        for (field, offset) in fields {
            checks.push_str(&format!(
                "POLYCHIP_CHECK(offsetof({ty}, {field}) == {offset});\n"
            ));
        }
    }
    // DLPack's own definitions (dlpack.h 1.x), to prove the polychip names
    // have exactly its layout.
    let dlpack = "typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;\n\
        typedef struct { int32_t device_type; int32_t device_id; } DLDevice;\n\
        typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;\n\
        typedef struct { void *data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t *shape; int64_t *strides; uint64_t byte_offset; } DLTensor;\n\
        typedef struct DLManagedTensor { DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLManagedTensor *self); } DLManagedTensor;\n\
        typedef struct DLManagedTensorVersioned { DLPackVersion version; void *manager_ctx; void (*deleter)(struct DLManagedTensorVersioned *self); uint64_t flags; DLTensor dl_tensor; } DLManagedTensorVersioned;\n";
    for (theirs, ours, fields) in [
        (
            "DLTensor",
            "polychip_dlpack_tensor_t",
            &[
                "data",
                "device",
                "ndim",
                "dtype",
                "shape",
                "strides",
                "byte_offset",
            ][..],
        ),
        (
            "DLManagedTensor",
            "polychip_dlpack_managed_t",
            &["dl_tensor", "manager_ctx", "deleter"][..],
        ),
        (
            "DLManagedTensorVersioned",
            "polychip_dlpack_versioned_t",
            &["version", "manager_ctx", "deleter", "flags", "dl_tensor"][..],
        ),
    ] {
        checks.push_str(&format!(
            "POLYCHIP_CHECK(sizeof({theirs}) == sizeof({ours}));\n"
        ));
        for f in fields {
            checks.push_str(&format!(
                "POLYCHIP_CHECK(offsetof({theirs}, {f}) == offsetof({ours}, {f}));\n"
            ));
        }
    }
    let dir = scratch("layout");
    for (cpp, file, assert) in [
        (false, "layout.c", "_Static_assert(c, #c)"),
        (true, "layout.cpp", "static_assert(c, #c)"),
    ] {
        let source = dir.join(file);
        std::fs::write(
            &source,
            format!(
                "#include <stddef.h>\n#include <stdint.h>\n#include \"libpolychip.h\"\n{dlpack}\
                 #define POLYCHIP_CHECK(c) {assert}\n{checks}int main(void) {{ return 0; }}\n"
            ),
        )
        .unwrap();
        compile(
            cpp,
            &[source],
            &dir.join(if cpp { "layout_cpp" } else { "layout_c" }),
            false,
        );
    }
}
