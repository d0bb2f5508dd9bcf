//! Every operator's args struct and op-table slot, as `spec/ops.toml`
//! lists them, has the same size and field offsets seen from C as the
//! offsets the generated Rust reports ([`OpInfo`]'s `size`, `table_offset`
//! and field offsets, each an `offset_of!`). Unlike `c_layout.rs`, whose
//! struct list is written by hand, this covers an operator as soon as it is
//! in the spec.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use polychip_plugin_sdk::Op;

#[test]
fn every_operator_has_the_same_layout_from_c() {
    let mut rust = BTreeMap::new();
    let mut lines = String::new();
    let mut print = |key: String, expr: String, value: usize| {
        lines.push_str(&format!("  printf(\"{key} %zu\\n\", (size_t)({expr}));\n"));
        rust.insert(key, value);
    };
    for op in Op::ALL {
        let info = op.info();
        print(
            format!("slot {op}"),
            format!("offsetof(PolychipOpTable, {op})"),
            info.table_offset,
        );
        print(
            format!("{} size", info.args),
            format!("sizeof({})", info.args),
            info.size,
        );
        for field in info.fields {
            print(
                format!("{}.{}", info.args, field.name),
                format!("offsetof({}, {})", info.args, field.name),
                field.offset,
            );
        }
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("op_layout");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("op_layout.c");
    std::fs::write(
        &source,
        format!(
            "#include <stddef.h>\n#include <stdio.h>\n#include \"polychip.h\"\n\nint main(void) {{\n{lines}  return 0;\n}}\n"
        ),
    )
    .unwrap();
    let exe = dir.join("op_layout");
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include");
    let compiled = cc::Build::new()
        .cargo_metadata(false)
        .opt_level(0)
        .target(env!("TARGET_TRIPLE"))
        .host(env!("TARGET_TRIPLE"))
        .get_compiler()
        .to_command()
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(&include)
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C compiler");
    assert!(
        compiled.status.success(),
        "the spec's structs do not compile against include/polychip.h:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(run.status.success());
    let c: BTreeMap<String, usize> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (key, value) = line.rsplit_once(' ').unwrap();
            (key.to_owned(), value.parse().unwrap())
        })
        .collect();
    let differ: Vec<String> = rust
        .iter()
        .filter(|(key, value)| c.get(*key) != Some(value))
        .map(|(key, value)| format!("{key}: Rust {value}, C {:?}", c.get(key)))
        .collect();
    assert!(differ.is_empty(), "layouts differ:\n{}", differ.join("\n"));
    assert_eq!(c.len(), rust.len());
}
