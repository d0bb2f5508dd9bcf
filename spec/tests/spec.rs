//! The spec reader's refusals, and the freshness of every file derived from
//! `spec/ops.toml` (one test binary: the crate's own library is built
//! without a test harness, to keep the workspace's build short).

mod model {

    use polychip_spec::model::{camel, parse, snake};

    const MINIMAL: &str = r#"
[dtypes]
float = ["f32", "f64"]
[table]
ops = [
  { name = "fill", args = "Fill", since = "1.0", family = "data", dtypes = "float", doc = "Fill." },
]
[args.Fill]
doc = "Fill."
fields = [
  { out = "out", dtype = "T", doc = "Out." },
  { f64 = "value", doc = "Value." },
]
"#;

    #[test]
    fn a_minimal_spec_reads() {
        let spec = parse(MINIMAL).unwrap();
        assert_eq!(spec.ops[0].dtypes, ["f32", "f64"]);
        assert_eq!(spec.args[0].since, (1, 0));
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            (
                r#"args = "Fill","#,
                r#"args = "Fil","#,
                "args \"Fil\" has no [args.Fil]",
            ),
            (r#"since = "1.0""#, r#"since = "one""#, "is not MAJOR.MINOR"),
            (
                r#"dtypes = "float""#,
                r#"dtypes = "floats""#,
                "not a set of [dtypes]",
            ),
            (
                r#"dtype = "T""#,
                r#"dtype = "T", shape = "like x""#,
                "\"x\" is not a tensor of this struct",
            ),
            (
                r#"{ f64 = "value", doc"#,
                r#"{ f64 = "value", since = "1.1", doc"#,
                "must be a scalar with a default",
            ),
            (
                r#"{ f64 = "value", doc"#,
                r#"{ f64 = "value", i64 = "v", doc"#,
                "exactly one of",
            ),
            (
                r#"{ out = "out", dtype = "T", doc"#,
                r#"{ out = "out", dtype = "T", alias = ["value"], doc"#,
                "\"value\" is not a tensor of this struct",
            ),
            (
                r#"{ f64 = "value", doc"#,
                r#"{ f64 = "value", colour = 1, doc"#,
                "unknown field `colour`",
            ),
            (
                r#"{ f64 = "value", doc = "Value." },"#,
                r#"{ f64 = "value", doc = "Value." }, { i64 = "out", doc = "Again." },"#,
                "field \"out\" appears twice",
            ),
            (
                r#"doc = "Fill." },"#,
                r#"doc = "Fill.", retype = { out = "f32" } },"#,
                "after the first (which carries the operator's dtype)",
            ),
        ];
        for (from, to, message) in cases {
            let text = MINIMAL.replacen(from, to, 1);
            let err = parse(&text).unwrap_err();
            assert!(err.contains(message), "{to}: {err}");
        }
    }

    #[test]
    fn the_table_is_append_only() {
        let text = MINIMAL.replace(
            r#"doc = "Fill." },"#,
            r#"doc = "Fill." },
      { name = "fill2", args = "Fill", since = "0.9", family = "data", dtypes = "float", doc = "Fill." },"#,
        );
        assert!(parse(&text).unwrap_err().contains("append-only"));
    }

    #[test]
    fn names_convert() {
        assert_eq!(snake("RmsNormBackward"), "rms_norm_backward");
        assert_eq!(camel("activation_backward"), "ActivationBackward");
    }
}

/// Every file derived from `spec/ops.toml` must be what the generator
/// writes now (rewritten outside CI when it is not; see `ensure_fresh`);
/// `include/polychip.h` then follows from the fresh ABI through
/// `cargo test -p polychip-plugin-sdk --test header`.
#[test]
fn derived_files_are_fresh() {
    let root = polychip_spec::workspace_root();
    let generated = polychip_spec::generate(&root).unwrap_or_else(|e| panic!("{e}"));
    let stale: Vec<String> = generated
        .iter()
        .filter_map(|(path, text)| {
            polychip_spec::ensure_fresh(path, text, "cargo run -p polychip-spec").err()
        })
        .collect();
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}
