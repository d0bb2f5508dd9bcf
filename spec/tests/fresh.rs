//! Every file derived from `spec/ops.toml` must be what the generator writes
//! now. When one is not, this test rewrites it (except under CI) and fails,
//! so the fresh files are committed with the change that made them. The
//! header `include/polychip.h` is then regenerated from the fresh ABI by
//! `cargo test -p polychip-plugin-sdk --test header`.

#[test]
fn derived_files_are_fresh() {
    let root = polychip_spec::workspace_root();
    let stale = polychip_spec::stale(&root).unwrap_or_else(|e| panic!("{e}"));
    if stale.is_empty() {
        return;
    }
    let names: Vec<String> = stale
        .iter()
        .map(|(p, _)| p.strip_prefix(&root).unwrap_or(p).display().to_string())
        .collect();
    if std::env::var_os("CI").is_none() {
        polychip_spec::write(&root).unwrap_or_else(|e| panic!("{e}"));
        panic!(
            "stale files derived from spec/ops.toml were regenerated: {}; review and commit them, then rerun the tests",
            names.join(", ")
        );
    }
    panic!(
        "files derived from spec/ops.toml are stale: {}; run `cargo run -p polychip-spec` and commit the result",
        names.join(", ")
    );
}
