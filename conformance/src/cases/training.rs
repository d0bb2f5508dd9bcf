//! Placeholder until the cases are written.

use super::OpInfo;

pub(super) fn ops() -> Vec<OpInfo> {
    Vec::new()
}
