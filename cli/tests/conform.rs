//! `polychip conform` as a vendor runs it: the planted-bug plugin is caught
//! bug by bug with the operator named, the bundled plugins pass, a failure
//! replays from its printed command, and waivers are listed and counted
//! apart.

mod common;

fn plugin(name: &str) -> String {
    common::built_plugin(name)
}

fn conform(args: &[&str]) -> (i32, String, serde_json::Value) {
    common::conform_report(args, &[])
}

fn failures_of<'a>(doc: &'a serde_json::Value, op: &str) -> Vec<&'a str> {
    doc["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["result"]["op"] == op)
        .map(|f| f["result"]["message"].as_str().unwrap())
        .collect()
}

#[test]
fn every_planted_bug_is_flagged_by_operator() {
    let planted = plugin("libpolychip_testplugin_planted.so");
    let (code, text, doc) = conform(&["--plugin", &planted, "--dtype", "f32"]);
    assert_eq!(code, 1, "failures make the exit status 1:\n{text}");
    let softmax = failures_of(&doc, "softmax");
    assert!(
        softmax
            .iter()
            .any(|m| m.contains("outside tolerance") && m.contains("got NaN")),
        "softmax overflow: {softmax:?}"
    );
    let cast = failures_of(&doc, "cast");
    assert!(
        cast.iter()
            .any(|m| m.contains("output dst") && m.contains("outside tolerance")),
        "bf16 truncation: {cast:?}"
    );
    let add = failures_of(&doc, "add");
    assert!(!add.is_empty(), "a's strides are ignored by add");
    assert!(doc["failures"].as_array().unwrap().iter().any(|f| {
        f["result"]["op"] == "add"
            && f["result"]["label"]
                .as_str()
                .unwrap()
                .contains("transposed")
    }));
    let exp = failures_of(&doc, "exp");
    assert!(
        exp.iter().any(|m| m.contains("input input was modified")),
        "exp writes its input: {exp:?}"
    );
    let mul = failures_of(&doc, "mul");
    assert!(
        mul.iter().any(|m| m.contains("never wrote")),
        "mul leaves an element unwritten: {mul:?}"
    );
    let sqrt = failures_of(&doc, "sqrt");
    assert!(
        sqrt.iter()
            .any(|m| m.contains("crashed") && m.contains("SIGSEGV")),
        "sqrt segfaults on 7 elements: {sqrt:?}"
    );
    let matmul = failures_of(&doc, "matmul");
    assert!(
        matmul.iter().any(|m| m.contains("panicked")),
        "matmul panics: {matmul:?}"
    );
    // The suite went on after the segfault: sqrt's other cases ran and passed.
    let rows = doc["rows"].as_array().unwrap();
    let sqrt_row = rows.iter().find(|r| r["op"] == "sqrt").unwrap();
    assert!(sqrt_row["passed"].as_u64().unwrap() > 0);
    // Correct operators pass.
    let fill_row = rows.iter().find(|r| r["op"] == "fill").unwrap();
    assert_eq!(fill_row["failed"], 0);
    // Every failure prints a command that replays it.
    assert!(text.contains("replay: polychip conform --plugin"), "{text}");
}

#[test]
fn a_printed_replay_command_reruns_exactly_that_case() {
    let planted = plugin("libpolychip_testplugin_planted.so");
    let (_, _, doc) = conform(&["--plugin", &planted, "--ops", "^mul$", "--dtype", "f32"]);
    let replay = doc["failures"][0]["replay"].as_str().unwrap().to_string();
    let case = replay.rsplit_once("--case ").unwrap().1.to_string();
    let (code, text, doc) = conform(&[
        "--plugin", &planted, "--ops", "^mul$", "--dtype", "f32", "--case", &case,
    ]);
    assert_eq!(code, 1, "{text}");
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["failed"], 1);
    assert_eq!(rows[0]["passed"], 0);
}

#[test]
fn waivers_are_listed_in_full_and_counted_apart() {
    let planted = plugin("libpolychip_testplugin_planted.so");
    let file = std::env::temp_dir().join(format!("waivers-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        "[[waiver]]\nop = \"mul\"\naction = \"skip\"\nreason = \"known bug 123: last element\"\n",
    )
    .unwrap();
    let (code, text, doc) = conform(&[
        "--plugin",
        &planted,
        "--ops",
        "^mul$",
        "--dtype",
        "f32",
        "--waivers",
        file.to_str().unwrap(),
    ]);
    std::fs::remove_file(&file).ok();
    assert_eq!(code, 0, "skipped cases are not failures:\n{text}");
    assert!(
        text.contains("mul every dtype: skipped: known bug 123: last element"),
        "{text}"
    );
    assert_eq!(doc["rows"][0]["passed"], 0);
    assert!(doc["rows"][0]["skipped"].as_u64().unwrap() > 0);
    assert_eq!(
        doc["waivers"]["waivers"][0]["reason"],
        "known bug 123: last element"
    );
}

/// The worker gets the selection as it was given, even a value that starts
/// with a dash (it once took `-?` for an option and every case "crashed").
#[test]
fn a_selection_that_starts_with_a_dash_reaches_the_worker() {
    let ferrite = plugin("libpolychip_vendor_ferrite.so");
    let (code, text, doc) = conform(&["--plugin", &ferrite, "--ops=-?^neg$", "--dtype=f32"]);
    assert_eq!(code, 0, "{text}");
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{text}");
    assert_eq!(rows[0]["failed"], 0, "{text}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    let (code, text, _) = conform(&["--ops", "(", "--plugin", "x"]);
    assert_eq!(code, 2);
    assert!(
        text.contains("--ops is not a valid regular expression"),
        "{text}"
    );
    let (code, text, _) = conform(&["--dtype", "f8"]);
    assert_eq!(code, 2);
    assert!(text.contains("unknown dtype \"f8\""), "{text}");
    for bad in ["0", "-1", "NaN", "100000"] {
        let arg = format!("--case-timeout={bad}");
        let (code, text, _) = conform(&[&arg, "--plugin", "x"]);
        assert_eq!(code, 2, "{bad}: {text}");
        assert!(
            text.contains(&format!("--case-timeout {bad} is not a number of seconds")),
            "{bad}: {text}"
        );
    }
}

/// Each bundled plugin implements and passes every operator in every
/// dtype (a test each, so that the two run side by side).
fn implements_and_passes_every_operator_in_every_dtype(name: &str) {
    let (code, text, doc) = conform(&["--plugin", &plugin(name)]);
    assert_eq!(code, 0, "{name}:\n{text}");
    common::assert_passes_every_operator(name, &doc);
}

#[test]
fn ferrite_implements_and_passes_every_operator_in_every_dtype() {
    implements_and_passes_every_operator_in_every_dtype("libpolychip_vendor_ferrite.so");
}

#[test]
fn cobalt_implements_and_passes_every_operator_in_every_dtype() {
    implements_and_passes_every_operator_in_every_dtype("libpolychip_vendor_cobalt.so");
}

/// A plugin whose errors run to megabytes (with terminal escapes): every
/// case it fails is reported failed, its message cut by the host to 64 KiB
/// and saying how long it was. Until 2026-12-06 the worker's result line
/// passed the parent's 1 MiB bound, was cut, was not read as a result, and
/// the case vanished: the plugin "passed" with 0 cases failed and exit 0.
#[test]
fn a_plugin_whose_errors_run_to_megabytes_fails_each_case_it_fails() {
    let plugin = common::fake_plugin("FAKE_FILL_LONG_ERROR");
    let (code, text, doc) = common::conform_report(
        &[
            "--plugin",
            plugin.to_str().unwrap(),
            "--ops",
            "^fill$",
            "--dtype",
            "f32",
        ],
        &[("POLYCHIP_NO_BUNDLED_PLUGINS", "1")],
    );
    assert_eq!(code, 1, "{}", &text[..text.len().min(4000)]);
    let row = &doc["rows"][0];
    assert_eq!((&row["op"], &row["dtype"]), (&"fill".into(), &"f32".into()));
    let failed = row["failed"].as_u64().unwrap();
    let all = failed + row["skipped"].as_u64().unwrap();
    assert!(failed > 100, "{row}");
    assert_eq!(row["passed"], 0, "{row}");
    let failures = doc["failures"].as_array().unwrap();
    assert_eq!(failures.len() as u64, failed, "each failed case is listed");
    assert!(all > 100);
    let said = "... (the plugin's message is 4194304 bytes; the first 65536 are kept)";
    for f in failures {
        let message = f["result"]["message"].as_str().unwrap();
        assert!(
            message.contains("fake: \u{1b}[31mfill failed"),
            "{}",
            &message[..200]
        );
        assert!(
            message.contains(said),
            "{}",
            &message[message.len() - 300..]
        );
        assert!(message.len() < 4 * 65536, "{} bytes", message.len());
    }
}

#[test]
fn a_plugin_that_crashes_or_hangs_while_loading_is_named_not_fatal() {
    let segv = common::broken_plugin("BROKEN_INIT_SEGV");
    let (code, text, _) = conform(&["--plugin", segv.to_str().unwrap(), "--ops", "^fill$"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(&format!(
            "{}: the plugin crashed while loading (signal 11, SIGSEGV)",
            segv.display()
        )),
        "{text}"
    );
    let hang = common::broken_plugin("BROKEN_INIT_HANG");
    let started = std::time::Instant::now();
    let (code, text, _) = common::conform_report(
        &["--plugin", hang.to_str().unwrap(), "--ops", "^fill$"],
        &[("POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS", "1")],
    );
    assert_eq!(code, 2, "{text}");
    assert!(started.elapsed().as_secs() < 30);
    assert!(
        text.contains(&format!(
            "{}: the plugin did not finish loading within 1 s",
            hang.display()
        )),
        "{text}"
    );
}

#[test]
fn a_crashing_plugin_on_the_path_is_reported_and_the_others_are_checked() {
    let abort = common::broken_plugin("BROKEN_INIT_ABORT");
    let (code, text, doc) = common::conform_report(
        &["--ops", "^fill$", "--dtype", "f32"],
        &[
            ("POLYCHIP_PLUGIN_PATH", abort.to_str().unwrap()),
            ("POLYCHIP_NO_BUNDLED_PLUGINS", "0"),
        ],
    );
    assert_eq!(
        code, 1,
        "a plugin that failed to load fails the run:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "polychip conform: failed to load: {}: the plugin crashed while loading (signal 6, SIGABRT)",
            abort.display()
        )),
        "{text}"
    );
    let vendors: Vec<&str> = doc
        .as_array()
        .expect("one report per plugin that loaded")
        .iter()
        .map(|r| r["vendor"].as_str().unwrap())
        .collect();
    assert!(
        vendors.iter().any(|v| v.starts_with("Ferrite"))
            && vendors.iter().any(|v| v.starts_with("Cobalt")),
        "{vendors:?}"
    );
}
