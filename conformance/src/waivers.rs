//! A vendor's waivers: the only way to skip a case or loosen a tolerance.
//! Every waiver carries a reason, the report lists every waiver in full, and
//! waived cases are counted apart from passes.
//!
//! The file is TOML:
//!
//! ```toml
//! [[waiver]]
//! op = "attention"          # the operator (exact name)
//! dtype = "bf16"            # optional: every dtype when absent
//! action = "loosen"         # "skip" or "loosen"
//! factor = 4.0              # for "loosen": multiplies the tolerance
//! reason = "bf16 accumulation in the tensor cores; fixed in driver 2.3"
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a waiver does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Do not run the cases.
    Skip,
    /// Multiply the tolerance by `factor`.
    Loosen,
}

/// One waiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Waiver {
    /// The operator.
    pub op: String,
    /// The dtype, or every dtype.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Skip or loosen.
    pub action: Action,
    /// Tolerance multiplier for `loosen`.
    #[serde(default)]
    pub factor: Option<f64>,
    /// Why: required, printed in the report.
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    waiver: Vec<Waiver>,
}

/// Every waiver of one file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Waivers {
    /// The file they came from.
    pub path: Option<String>,
    /// The waivers, in file order.
    pub waivers: Vec<Waiver>,
}

impl Waivers {
    /// Reads and checks a waiver file; the error names the file and the problem.
    pub fn load(path: &Path) -> Result<Waivers, String> {
        let text = polychip_files::read_text_file(path, polychip_files::MAX_TEXT_FILE)
            .map_err(|e| format!("{}: cannot read the waiver file: {e}", path.display()))?;
        let file: File = toml::from_str(&text)
            .map_err(|e| format!("{}: not a valid waiver file: {e}", path.display()))?;
        for (i, w) in file.waiver.iter().enumerate() {
            let at = format!("{}: waiver {} (op {})", path.display(), i + 1, w.op);
            if w.reason.trim().is_empty() {
                return Err(format!("{at}: every waiver needs a reason"));
            }
            match (w.action, w.factor) {
                (Action::Loosen, Some(f)) if f.is_finite() && f >= 1.0 => {}
                (Action::Loosen, _) => {
                    return Err(format!(
                        "{at}: action \"loosen\" needs a factor of at least 1"
                    ));
                }
                (Action::Skip, Some(_)) => {
                    return Err(format!("{at}: action \"skip\" takes no factor"));
                }
                (Action::Skip, None) => {}
            }
        }
        Ok(Waivers {
            path: Some(path.display().to_string()),
            waivers: file.waiver,
        })
    }

    /// The waiver that applies to (`op`, `dtype`), the most specific first.
    pub fn find(&self, op: &str, dtype: &str) -> Option<&Waiver> {
        let matching = |w: &&Waiver| w.op == op && w.dtype.as_deref().is_none_or(|d| d == dtype);
        self.waivers
            .iter()
            .filter(matching)
            .max_by_key(|w| w.dtype.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Waivers, String> {
        let path = std::env::temp_dir().join(format!(
            "waivers-{}-{}.toml",
            std::process::id(),
            text.len()
        ));
        std::fs::write(&path, text).unwrap();
        let r = Waivers::load(&path);
        std::fs::remove_file(&path).ok();
        r
    }

    #[test]
    fn waivers_need_reasons_and_factors() {
        let w = load("[[waiver]]\nop = \"softmax\"\naction = \"skip\"\nreason = \"known\"\n\n[[waiver]]\nop = \"softmax\"\ndtype = \"bf16\"\naction = \"loosen\"\nfactor = 2.0\nreason = \"r\"\n").unwrap();
        assert_eq!(w.find("softmax", "bf16").unwrap().action, Action::Loosen);
        assert_eq!(w.find("softmax", "f32").unwrap().action, Action::Skip);
        assert!(w.find("matmul", "f32").is_none());
        let e = load("[[waiver]]\nop = \"x\"\naction = \"skip\"\nreason = \" \"\n").unwrap_err();
        assert!(e.contains("needs a reason"), "{e}");
        let e = load("[[waiver]]\nop = \"x\"\naction = \"loosen\"\nreason = \"r\"\n").unwrap_err();
        assert!(e.contains("needs a factor"), "{e}");
        let e = load("[[waiver]]\nop = \"x\"\naction = \"skip\"\nreason = \"r\"\ntolerance = 3\n")
            .unwrap_err();
        assert!(e.contains("not a valid waiver file"), "{e}");
    }
}
