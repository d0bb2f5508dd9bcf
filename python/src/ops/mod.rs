//! `polychip.ops`: every operator, derived from `spec/ops.toml`
//! (`generated.rs`; the stub `polychip/ops.pyi` comes from the same spec).

#[rustfmt::skip]
mod generated;

pub(crate) use generated::register;
