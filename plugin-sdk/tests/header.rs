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
    if let Err(e) = polychip_spec::ensure_fresh(
        &header_path,
        &generated,
        "cargo test -p polychip-plugin-sdk --test header",
    ) {
        panic!("{e}");
    }
}
