//! The committed C header must equal what cbindgen generates from the Rust ABI
//! types. When it does not, this test rewrites `include/polychip.h` (except
//! under CI) and fails, so the fresh header is committed with the change that
//! made it.

use std::path::PathBuf;

#[test]
fn committed_header_is_fresh() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("../include/polychip.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("plugin-sdk/cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    // Everything the header declares belongs to the ABI's namespace; a Rust
    // type of the SDK leaking in (cbindgen follows associated constants)
    // would be announced to every vendor as part of the contract.
    for line in generated.lines() {
        let declares = line.starts_with("typedef")
            || line.starts_with("#define")
            || line.starts_with("struct ");
        if declares && !line.contains("Polychip") && !line.contains("POLYCHIP") {
            panic!("include/polychip.h would declare a name outside the ABI: {line}");
        }
    }
    let committed = std::fs::read_to_string(&header_path).unwrap_or_default();
    if committed == generated {
        return;
    }
    if std::env::var_os("CI").is_none() {
        std::fs::write(&header_path, &generated).expect("write include/polychip.h");
        panic!(
            "include/polychip.h was stale and has been regenerated from plugin-sdk/src/abi; \
             review and commit it, then rerun the tests"
        );
    }
    panic!(
        "include/polychip.h is stale: run `cargo test -p polychip-plugin-sdk --test header` and commit the result"
    );
}
