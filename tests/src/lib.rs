//! Integration tests live in `tests/`; this library is empty. The tests
//! compile `c/fake_plugin.c` into deliberately broken plugins and load the
//! bundled ones, so they need `cargo build --workspace` to have built the
//! bundled plugins (the README's test command does that first).
