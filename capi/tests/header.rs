//! `include/libpolychip.h` must equal what cbindgen generates from this
//! crate. When it does not, this test rewrites it (except under CI) and
//! fails, so the fresh header is committed with the change that made it.

use std::path::PathBuf;

#[test]
fn committed_header_is_fresh() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("../include/libpolychip.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("capi/cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    // Everything the header declares belongs to the API's namespace.
    for line in generated.lines() {
        let declares = line.starts_with("typedef")
            || line.starts_with("#define")
            || line.starts_with("struct ");
        if declares && !line.contains("polychip") && !line.contains("POLYCHIP") {
            panic!("include/libpolychip.h would declare a name outside the API: {line}");
        }
    }
    if let Err(e) = polychip_spec::ensure_fresh(
        &header_path,
        &generated,
        "cargo test -p polychip-capi --test header",
    ) {
        panic!("{e}");
    }
}
