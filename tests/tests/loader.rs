//! How the host treats plugins that break the ABI's rules: each gives an
//! error naming the file and the cause, and the host keeps working with the
//! other plugins.

mod common;

use polychip_host::{DType, ErrorCode, HostError, LoadOptions, Runtime};
use polychip_plugin_sdk::abi::POLYCHIP_ABI_MINOR as MINOR;

fn load_error(define: &str) -> HostError {
    let path = common::fake_plugin(Some(define));
    let mut runtime = Runtime::default();
    let error = runtime
        .add(&path, &LoadOptions::default())
        .expect_err("the plugin must be refused");
    let message = error.to_string();
    assert!(
        message.contains(path.to_str().unwrap()),
        "the message names the file: {message}"
    );
    error
}

#[test]
fn a_plugin_of_another_major_is_refused_naming_both_versions() {
    let error = load_error("FAKE_MAJOR2");
    assert!(
        matches!(
            error,
            HostError::VersionMismatch {
                plugin_major: 2,
                host_major: 1,
                ..
            }
        ),
        "{error:?}"
    );
    let error = load_error("FAKE_TABLE_MAJOR2");
    assert!(
        matches!(
            error,
            HostError::VersionMismatch {
                plugin_major: 2,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&format!(
            "plugin ABI 2.{MINOR} is not compatible with this host's ABI 1.{MINOR}"
        )),
        "{error}"
    );
}

#[test]
fn a_minor_older_than_the_minimum_is_refused() {
    let path = common::fake_plugin(None);
    let mut runtime = Runtime::default();
    let error = runtime
        .add(
            &path,
            &LoadOptions {
                min_minor: MINOR + 1,
            },
        )
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("plugin ABI 1.{MINOR} is not compatible")),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains(&format!("accepts 1.{} and newer", MINOR + 1)),
        "{error}"
    );
}

#[test]
fn a_plugin_may_refuse_a_host_that_is_too_old() {
    let error = load_error("FAKE_NEEDS_HOST_1_7");
    assert_eq!(error.code(), ErrorCode::VersionMismatch);
    assert!(
        error
            .to_string()
            .contains("fake needs a host of ABI 1.7 or newer"),
        "{error}"
    );
}

/// The message of an entry that fails is kept with its terminal escapes
/// and bidirectional characters escaped (its line breaks kept), as a device
/// name is: every command
/// prints it (`polychip devices` printed it as it was until 2026-12-06, so a
/// plugin could clear the screen or set the terminal's title).
#[test]
fn a_failing_entrys_message_is_escaped() {
    let message = load_error("FAKE_INIT_FAILS_WITH_ESCAPES").to_string();
    assert!(
        message.contains(
            "fake: no device\\u{1b}[2J\\u{1b}]0;title\\u{7} \\u{202e} here\nsecond line\\r"
        ),
        "{message}"
    );
    // Its lines are kept (a plugin may list what it knows, one a line).
    assert!(
        !message.chars().any(|c| c.is_control() && c != '\n'),
        "{message}"
    );
}

/// An allocator that hands out memory still in use (here the same memory
/// every time) is a contract violation named at the second allocation:
/// until 2026-12-06 two buffers shared it, and a write to one changed the
/// other without a word.
#[test]
fn an_allocation_overlapping_a_live_one_is_refused() {
    let device = common::first_device(&common::fake_plugin(Some("FAKE_ALLOC_ALIASES")));
    let a = device.zeros(DType::F32, &[4]).unwrap();
    let error = device.zeros(DType::F32, &[4]).unwrap_err().to_string();
    assert!(
        error.contains("mem_alloc")
            && error.contains("returned 16 bytes at 0x")
            && error.contains("which overlap the 16 bytes at 0x")
            && error.contains(
                "it returned before and that are still in use (two buffers would share memory)"
            ),
        "{error}"
    );
    assert_eq!(device.memory_in_use(), 16, "the refused one is not counted");
    drop(a);
    // Once the first is gone, its memory may be handed out again.
    let b = device.zeros(DType::F32, &[4]).unwrap();
    device.exec().fill(&b, 2.5).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), [2.5; 4]);
}

#[test]
fn a_newer_minor_with_an_appended_table_loads() {
    let plugin = common::load(&common::fake_plugin(Some("FAKE_NEWER_MINOR")));
    assert_eq!(plugin.abi_version(), (1, 9));
    assert_eq!(plugin.devices().len(), 1);
}

#[test]
fn a_library_without_the_entry_symbol_is_refused() {
    let error = load_error("FAKE_NO_ENTRY");
    assert!(
        matches!(error, HostError::NoEntrySymbol { .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("no entry symbol polychip_plugin_init_v1")
    );
}

#[test]
fn a_too_small_struct_size_is_refused() {
    let error = load_error("FAKE_SMALL_TABLE");
    assert!(
        matches!(
            error,
            HostError::StructTooSmall {
                structure: "PolychipPluginApi",
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_null_required_function_is_refused_by_name() {
    let error = load_error("FAKE_NULL_MEM_ALLOC");
    assert!(
        matches!(
            error,
            HostError::MissingFunction {
                function: "mem_alloc",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("required function mem_alloc is NULL")
    );
}

#[test]
fn an_error_pointer_the_host_never_made_is_a_contract_violation() {
    let error = load_error("FAKE_FOREIGN_ERROR");
    assert!(
        matches!(
            error,
            HostError::Contract {
                function: "device_count",
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_file_that_is_not_a_shared_library_is_refused() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("not_a_library.so");
    std::fs::write(&path, "this is text, not ELF\n").unwrap();
    let mut runtime = Runtime::default();
    let error = runtime.add(&path, &LoadOptions::default()).unwrap_err();
    assert!(matches!(error, HostError::NotALibrary { .. }), "{error:?}");
    assert!(
        error.to_string().contains("not a loadable shared library"),
        "{error}"
    );
}

#[test]
fn a_null_operator_entry_is_reported_and_counted_and_the_rest_works() {
    let path = common::fake_plugin(None);
    let device = common::first_device(&path);
    let t = device.zeros(DType::F32, &[4]).unwrap();
    device.exec().fill(&t, 2.5).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [2.5; 4]);
    let before = device.plugin().unimplemented_calls();
    let error = device.exec().add(&t, &t, &t, 1.0).unwrap_err();
    assert!(
        matches!(error, HostError::OpUnimplemented { op: "add", .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "Fake: operator add is not implemented (its op-table entry is NULL)"
    );
    assert_eq!(device.plugin().unimplemented_calls(), before + 1);
    assert!(device.plugin().ops().missing().contains(&"matmul"));
}

#[test]
fn a_plugin_of_an_older_minor_lacks_the_newer_operators_whatever_its_table_holds() {
    // An ABI 1.1 plugin whose op table has the 1.2 header's size and, in
    // `sigmoid`'s slot (added in 1.2), a function that aborts: the host
    // reads the slot as NULL, so the call is "not implemented" (what a
    // caller falls back on), and the plugin still loads and works.
    let path = common::fake_plugin(Some("FAKE_MINOR_1_1"));
    let device = common::first_device(&path);
    assert_eq!(device.plugin().abi_version(), (1, 1));
    let ops = device.plugin().ops();
    assert_eq!(ops.implemented(), ["fill"]);
    for op in [
        "gelu_erf",
        "gelu_erf_backward",
        "sigmoid",
        "sigmoid_backward",
        "tanh_backward",
    ] {
        assert!(ops.missing().contains(&op), "{op}");
    }
    let t = device.zeros(DType::F32, &[4]).unwrap();
    device.exec().fill(&t, 2.5).unwrap();
    let before = device.plugin().unimplemented_calls();
    let error = device
        .exec()
        .unary(polychip_host::UnaryOp::Sigmoid, &t, &t)
        .unwrap_err();
    assert!(
        matches!(error, HostError::OpUnimplemented { op: "sigmoid", .. }),
        "{error:?}"
    );
    assert_eq!(device.plugin().unimplemented_calls(), before + 1);
    assert_eq!(t.to_vec::<f32>().unwrap(), [2.5; 4]);
}

#[test]
fn a_plugin_of_abi_1_2_lacks_the_1_3_operators_whatever_its_table_holds() {
    // An ABI 1.2 plugin whose op table has the 1.3 header's size and, in
    // `sin`'s, `select`'s and `eq`'s slots (added in 1.3), functions that
    // abort: the host reads those slots as NULL (a 1.2 plugin never
    // receives a 1.3 operator), and keeps its 1.2 entries (`sigmoid` and
    // `add`, here functions that abort too, so they are only listed or
    // refused, never called).
    let path = common::fake_plugin(Some("FAKE_MINOR_1_2"));
    let device = common::first_device(&path);
    assert_eq!(device.plugin().abi_version(), (1, 2));
    let ops = device.plugin().ops();
    assert_eq!(ops.implemented(), ["fill", "add", "sigmoid"]);
    for op in [
        "sin",
        "cos",
        "select",
        "masked_fill",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
    ] {
        assert!(ops.missing().contains(&op), "{op}");
    }
    let t = device.zeros(DType::F32, &[4]).unwrap();
    let mask = device.zeros(DType::Bool, &[4]).unwrap();
    device.exec().fill(&t, 2.5).unwrap();
    let before = device.plugin().unimplemented_calls();
    let exec = device.exec();
    let sin = exec.unary(polychip_host::UnaryOp::Sin, &t, &t).unwrap_err();
    assert!(
        matches!(sin, HostError::OpUnimplemented { op: "sin", .. }),
        "{sin:?}"
    );
    let select = exec.select(&mask, &t, &t, &t).unwrap_err();
    assert!(
        matches!(select, HostError::OpUnimplemented { op: "select", .. }),
        "{select:?}"
    );
    let eq = exec.eq(&t, &t, &mask).unwrap_err();
    assert!(
        matches!(eq, HostError::OpUnimplemented { op: "eq", .. }),
        "{eq:?}"
    );
    // `add` is in its table, but on integers only since ABI 1.3: the host
    // refuses an i32 add (counted as not implemented) without calling it.
    let i = device.zeros(DType::I32, &[4]).unwrap();
    let add = exec.add(&i, &i, &i, 1.0).unwrap_err();
    assert!(
        matches!(
            add,
            HostError::DtypeUnimplemented {
                op: "add",
                dtype: DType::I32,
                since: (1, 3),
                abi: (1, 2),
                ..
            }
        ),
        "{add:?}"
    );
    assert_eq!(add.code(), polychip_host::ErrorCode::Unimplemented);
    assert_eq!(device.plugin().unimplemented_calls(), before + 4);
    assert_eq!(t.to_vec::<f32>().unwrap(), [2.5; 4]);
}

#[test]
fn a_plugin_of_abi_1_3_lacks_the_1_4_operators_whatever_its_table_holds() {
    // An ABI 1.3 plugin whose op table has the 1.4 header's size and, in
    // `gather`'s, `cumsum`'s, `any`'s and `bitwise_and`'s slots (added in
    // 1.4), functions that abort: the host reads those slots as NULL and
    // refuses the calls as not implemented before any plugin code runs.
    let path = common::fake_plugin(Some("FAKE_MINOR_1_3"));
    let device = common::first_device(&path);
    assert_eq!(device.plugin().abi_version(), (1, 3));
    let ops = device.plugin().ops();
    assert_eq!(ops.implemented(), ["fill", "sin"]);
    for op in [
        "gather",
        "scatter_add",
        "cumsum",
        "any",
        "all",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
    ] {
        assert!(ops.missing().contains(&op), "{op}");
    }
    let t = device.zeros(DType::F32, &[4]).unwrap();
    let idx = device.zeros(DType::I64, &[4]).unwrap();
    let mask = device.zeros(DType::Bool, &[4]).unwrap();
    let flag = device.zeros(DType::Bool, &[]).unwrap();
    let out = device.zeros(DType::F32, &[4]).unwrap();
    device.exec().fill(&t, 2.5).unwrap();
    let before = device.plugin().unimplemented_calls();
    let exec = device.exec();
    let refused = [
        ("gather", exec.gather(&t, &idx, &out, 0).unwrap_err()),
        ("cumsum", exec.cumsum(&t, &t, 0).unwrap_err()),
        ("any", exec.any(&t, &flag, 0, false).unwrap_err()),
        (
            "bitwise_and",
            exec.bitwise_and(&mask, &mask, &mask).unwrap_err(),
        ),
    ];
    for (name, e) in &refused {
        assert!(
            matches!(e, HostError::OpUnimplemented { op, .. } if op == name),
            "{e:?}"
        );
    }
    assert_eq!(device.plugin().unimplemented_calls(), before + 4);
    assert_eq!(t.to_vec::<f32>().unwrap(), [2.5; 4]);
}

#[test]
fn failures_do_not_stop_the_other_plugins() {
    let bad = common::fake_plugin(Some("FAKE_NULL_MEM_ALLOC"));
    let good = common::cobalt_path();
    let runtime = Runtime::load(&[bad.clone(), good], &LoadOptions::default());
    assert_eq!(runtime.failures().len(), 1);
    assert_eq!(runtime.failures()[0].path, bad);
    let device = &runtime.devices_of("cobalt")[0];
    let t = device.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 2.0]);
}

#[test]
fn loading_the_same_file_twice_returns_the_same_plugin() {
    let path = common::fake_plugin(None);
    let a = common::load(&path);
    let b = common::load(&path);
    assert!(std::sync::Arc::ptr_eq(&a, &b));
}

/// `Runtime::add` on `path` in a thread, failing the test instead of
/// hanging it when loading blocks (as `dlopen` on a FIFO does).
fn add_within_seconds(path: std::path::PathBuf, seconds: u64) -> Result<usize, HostError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut runtime = Runtime::default();
        let result = runtime
            .add(&path, &LoadOptions::default())
            .map(|p| p.devices().len());
        let _ = tx.send(result);
    });
    rx.recv_timeout(std::time::Duration::from_secs(seconds))
        .expect("loading did not return: the file was opened instead of refused")
}

#[test]
fn a_fifo_a_directory_or_a_device_is_refused_before_it_is_opened() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("loader-special-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("libfifo.so");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let subdir = dir.join("libdir.so");
    std::fs::create_dir_all(&subdir).unwrap();
    for (path, kind) in [
        (fifo, "a FIFO"),
        (subdir, "a directory"),
        ("/dev/zero".into(), "a character device"),
    ] {
        let error = add_within_seconds(path.clone(), 10).unwrap_err();
        assert!(matches!(error, HostError::NotALibrary { .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!(
                "{}: not a loadable shared library: it is {kind}, not a regular file",
                path.display()
            )
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn one_file_under_several_names_is_loaded_once() {
    let good = common::fake_plugin(None);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("loader-aliases-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    let symlink = dir.join("libfake-symlink.so");
    let hard = dir.join("libfake-hard.so");
    std::os::unix::fs::symlink(&good, &symlink).unwrap();
    std::fs::hard_link(&good, &hard).unwrap();

    let runtime = Runtime::load(
        &[good.clone(), symlink.clone(), hard.clone(), hard.clone()],
        &LoadOptions::default(),
    );
    assert!(runtime.failures().is_empty(), "{:?}", runtime.failures());
    assert_eq!(runtime.plugins().len(), 1);
    assert_eq!(runtime.devices().len(), 1, "its one device, listed once");
    assert!(std::sync::Arc::ptr_eq(
        &common::load(&hard),
        &common::load(&good)
    ));

    let list = format!(
        "{}:{}:{}",
        hard.display(),
        symlink.display(),
        hard.display()
    );
    let (files, problems) =
        polychip_host::discovery::discover_from(&list, "POLYCHIP_PLUGIN_PATH", &[]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(files, [hard], "the first name is kept");
    std::fs::remove_dir_all(&dir).ok();
}

/// A plugin's device count is bounded before the host queries each device:
/// a broken count (an uninitialised `uint32_t`) is refused, naming it,
/// instead of filling memory with billions of device entries.
#[test]
fn a_device_count_beyond_the_hosts_bound_is_refused() {
    let error = load_error("FAKE_HUGE_COUNT");
    let message = error.to_string();
    assert!(
        message.contains("device_count")
            && message.contains("reported 4294967295 devices")
            && message.contains("(4096)"),
        "{message}"
    );
}

/// The vendor name makes the device ids (`vendor:N`): one that could not be
/// written in a device list is refused, naming the character.
#[test]
fn a_vendor_name_that_cannot_name_devices_is_refused() {
    let message = load_error("FAKE_VENDOR_COLON").to_string();
    assert!(message.contains("vendor \"Fa:ke\" holds ':'"), "{message}");
}

/// A device name with control characters (terminal escapes, a newline) and
/// a right-to-left override is kept with them escaped, so printing it
/// cannot drive the terminal or reorder the line (the override was kept
/// until 2026-12-06).
#[test]
fn control_characters_in_a_device_name_are_escaped() {
    let plugin = common::load(&common::fake_plugin(Some("FAKE_CONTROL_NAME")));
    assert_eq!(plugin.devices()[0].name, "Fake\\u{1b}[2J\\nF0\\u{202e}");
}

/// Peaks and bandwidths no device can have (NaN, infinite, negative,
/// 1e300) are taken as 0, the ABI's "not known", each a load finding
/// naming the plugin, the device, the field and the value (until
/// 2026-12-06 `polychip devices` printed 1e300 FLOP/s in 301 digits and
/// `NaN G`, and its JSON a `null`).
#[test]
fn device_figures_no_device_can_have_are_taken_as_unknown_and_named() {
    let plugin = common::load(&common::fake_plugin(Some("FAKE_ABSURD_PROPS")));
    let props = &plugin.devices()[0];
    for (field, value) in [
        ("peak_flops_f32", props.peak_flops_f32),
        ("peak_flops_bf16", props.peak_flops_bf16),
        ("peak_flops_f16", props.peak_flops_f16),
        ("memory_bandwidth", props.memory_bandwidth),
        ("link_bandwidth", props.link_bandwidth),
    ] {
        assert_eq!(value.to_bits(), 0f64.to_bits(), "{field} = {value}");
    }
    assert_eq!(props.memory_bytes, 1 << 20, "memory is kept");
    let findings = plugin.load_findings().join("\n");
    for said in [
        "plugin Fake device 0 reported peak_flops_f32 = 1e300, not a figure from 0 (not known) \
         to 1e20 FLOP/s; it is taken as 0 (not known)",
        "peak_flops_bf16 = NaN",
        "peak_flops_f16 = -5e12",
        "memory_bandwidth = inf, not a figure from 0 (not known) to 1e18 bytes/s",
        "link_bandwidth = -1e0",
    ] {
        assert!(findings.contains(said), "{said:?} in {findings}");
    }
    // A plugin whose figures are sensible has no such finding.
    assert!(
        common::load(&common::fake_plugin(None))
            .load_findings()
            .is_empty()
    );
}

/// Two files of one vendor (a copied plugin, or two plugins that chose one
/// name) would give two devices each id: the second is refused, naming both
/// files, and the first stays loaded.
#[test]
fn a_second_plugin_of_a_vendor_already_loaded_is_refused() {
    let ferrite = common::ferrite_path();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("loader-vendor-taken-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libpolychip_vendor_ferrite_copy.so");
    std::fs::copy(&ferrite, &copy).unwrap();
    let runtime = Runtime::load(&[ferrite.clone(), copy.clone()], &LoadOptions::default());
    assert_eq!(runtime.plugins().len(), 1);
    assert_eq!(runtime.plugins()[0].path(), ferrite);
    assert_eq!(runtime.failures().len(), 1);
    let message = runtime.failures()[0].error.to_string();
    assert!(
        message.contains(copy.to_str().unwrap())
            && message.contains(ferrite.to_str().unwrap())
            && message.contains("\"Ferrite\" is already taken"),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Whether subnormal f32 arithmetic on this thread keeps subnormals and
/// rounds to nearest even (an opaque multiply and add).
fn default_float_environment() -> bool {
    let tiny = std::hint::black_box(f32::from_bits(1));
    let one = std::hint::black_box(1.0f32);
    let half_ulp = std::hint::black_box(2f32.powi(-24));
    (tiny * one).to_bits() == 1 && one + half_ulp == 1.0
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_library_that_turns_on_flush_to_zero_when_loaded_is_undone_and_named() {
    // ABI rule 12: the host puts back the floating-point environment a
    // plugin's constructor changed (as -ffast-math's crtfastmath.o does).
    use polychip_host::ffi::fpenv::{FpEnv, take_change};
    let _ = take_change();
    let before = FpEnv::current();
    let path = common::fake_plugin(Some("FAKE_FAST_MATH_CTOR"));
    let device = common::first_device(&path);
    assert_eq!(FpEnv::current(), before);
    assert!(default_float_environment());
    assert_eq!(device.plugin().fp_env_changes(), 1);
    let change = take_change().expect("the load's change is recorded");
    let text = change.to_string();
    assert!(text.contains("loading"), "{text}");
    assert!(
        text.contains("flush-to-zero (MXCSR.FZ) turned on"),
        "{text}"
    );
    assert!(
        text.contains("denormals-are-zero (MXCSR.DAZ) turned on"),
        "{text}"
    );
    // The plugin works; its calls change nothing more.
    let t = device.zeros(DType::F32, &[4]).unwrap();
    device.exec().fill(&t, 1.5).unwrap();
    assert_eq!(take_change(), None);
    assert_eq!(device.plugin().fp_env_changes(), 1);
}

#[test]
fn an_operator_that_leaves_the_rounding_mode_changed_is_undone_and_named() {
    use polychip_host::ffi::fpenv::{FpEnv, take_change};
    let path = common::fake_plugin(Some("FAKE_FILL_ROUNDS_UP"));
    let device = common::first_device(&path);
    let _ = take_change();
    let before = FpEnv::current();
    let t = device.zeros(DType::F32, &[4]).unwrap();
    for round in 1..=2 {
        device.exec().fill(&t, 0.25).unwrap();
        assert_eq!(FpEnv::current(), before, "round {round}");
        assert!(default_float_environment(), "round {round}");
        let change = take_change().expect("the call's change is recorded");
        assert_eq!(change.function, "fill");
        assert!(
            change
                .what
                .contains("rounding mode changed from to nearest to upward")
                || !cfg!(target_arch = "x86_64"),
            "{change}"
        );
        assert_eq!(device.plugin().fp_env_changes(), round);
    }
    assert_eq!(t.to_vec::<f32>().unwrap(), [0.25; 4]);
}
