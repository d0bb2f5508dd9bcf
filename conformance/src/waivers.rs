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

use polychip_host::DType;
use serde::{Deserialize, Serialize};

/// The most a waiver may multiply a tolerance by: a million times the
/// tolerance already lets any result through, so beyond it the check would
/// be off without saying so (`action = "skip"` says so).
pub const MAX_FACTOR: f64 = 1e6;

/// A factor for the report: `4`, `2.5`, `1e6`, never hundreds of digits.
pub fn fmt_factor(f: f64) -> String {
    let plain = format!("{f}");
    if plain.len() <= 10 {
        plain
    } else {
        format!("{f:e}")
    }
}

/// Edits (insertions, deletions, substitutions) between `a` and `b`.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Checks `w`'s operator and dtype against the suite's: the message names
/// the close matches, or every operator when none is close.
fn check_target(w: &Waiver) -> Result<(), String> {
    let registry = crate::cases::registry();
    let Some(op) = registry.iter().find(|o| o.name == w.op) else {
        let close: Vec<&str> = registry
            .iter()
            .map(|o| o.name)
            .filter(|n| {
                let near = if w.op.len() <= 3 { 1 } else { 2 };
                edits(n, &w.op) <= near || (w.op.len() >= 3 && n.contains(w.op.as_str()))
            })
            .collect();
        let names: Vec<&str> = registry.iter().map(|o| o.name).collect();
        return Err(if close.is_empty() {
            format!(
                "the suite has no operator {:?}; its operators are {}",
                w.op,
                names.join(", ")
            )
        } else {
            format!(
                "the suite has no operator {:?}; did you mean {}?",
                w.op,
                close.join(" or ")
            )
        });
    };
    if let Some(d) = &w.dtype {
        let Some(dtype) = DType::from_name(d) else {
            let all: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            return Err(format!(
                "there is no dtype {d:?} (the dtypes are {})",
                all.join(", ")
            ));
        };
        if !op.dtypes.contains(&dtype) {
            let tested: Vec<&str> = op.dtypes.iter().map(|d| d.name()).collect();
            return Err(format!(
                "the suite tests {} in {} only, not {d}, so the waiver would never apply",
                w.op,
                tested.join(", ")
            ));
        }
    }
    Ok(())
}

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
            let at = format!("{}: waiver {} (op {:?})", path.display(), i + 1, w.op);
            check_target(w).map_err(|e| format!("{at}: {e}"))?;
            if let Some(j) = file.waiver[..i]
                .iter()
                .position(|o| o.op == w.op && o.dtype == w.dtype)
            {
                return Err(format!(
                    "{at}: waiver {} already covers {} in {}; give one waiver per operator and \
                     dtype",
                    j + 1,
                    w.op,
                    w.dtype.as_deref().unwrap_or("every dtype")
                ));
            }
            if w.reason.trim().is_empty() {
                return Err(format!("{at}: every waiver needs a reason"));
            }
            match (w.action, w.factor) {
                (Action::Loosen, Some(f)) if f.is_finite() && (1.0..=MAX_FACTOR).contains(&f) => {}
                (Action::Loosen, Some(f)) if f > MAX_FACTOR => {
                    return Err(format!(
                        "{at}: factor {} is more than {MAX_FACTOR:e}; a tolerance loosened that \
                         far checks nothing: use action \"skip\" to waive the operator",
                        fmt_factor(f)
                    ));
                }
                (Action::Loosen, _) => {
                    return Err(format!(
                        "{at}: action \"loosen\" needs a factor from 1 to {MAX_FACTOR:e}"
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
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("waivers-{}-{n}.toml", std::process::id()));
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
        let e = load("[[waiver]]\nop = \"add\"\naction = \"skip\"\nreason = \" \"\n").unwrap_err();
        assert!(e.contains("needs a reason"), "{e}");
        let e =
            load("[[waiver]]\nop = \"add\"\naction = \"loosen\"\nreason = \"r\"\n").unwrap_err();
        assert!(e.contains("needs a factor"), "{e}");
        let e = load("[[waiver]]\nop = \"x\"\naction = \"skip\"\nreason = \"r\"\ntolerance = 3\n")
            .unwrap_err();
        assert!(e.contains("not a valid waiver file"), "{e}");
    }

    #[test]
    fn waivers_name_real_ops_and_dtypes_once_within_bounds() {
        let one = |op: &str, dtype: &str, extra: &str| {
            format!(
                "[[waiver]]\nop = \"{op}\"\n{dtype}action = \"loosen\"\nfactor = 2.0\nreason = \"r\"\n{extra}"
            )
        };
        let e = load(&one("ad", "", "")).unwrap_err();
        assert!(
            e.contains("waiver 1 (op \"ad\"): the suite has no operator \"ad\"; did you mean add"),
            "{e}"
        );
        let e = load(&one("zzzzzz", "", "")).unwrap_err();
        assert!(
            e.contains("its operators are") && e.contains("matmul"),
            "{e}"
        );
        let e = load(&one("add", "dtype = \"f33\"\n", "")).unwrap_err();
        assert!(
            e.contains("waiver 1 (op \"add\"): there is no dtype \"f33\""),
            "{e}"
        );
        let e = load(&one("matmul", "dtype = \"bool\"\n", "")).unwrap_err();
        assert!(e.contains("would never apply"), "{e}");
        // Two waivers of one (op, dtype), whether they agree or not.
        let twice = format!(
            "{}{}",
            one("add", "dtype = \"f32\"\n", ""),
            "[[waiver]]\nop = \"add\"\ndtype = \"f32\"\naction = \"skip\"\nreason = \"r\"\n"
        );
        let e = load(&twice).unwrap_err();
        assert!(
            e.contains("waiver 2 (op \"add\"): waiver 1 already covers add in f32"),
            "{e}"
        );
        let e = load(&one("add", "", "").replace("2.0", "1e308")).unwrap_err();
        assert!(
            e.contains("factor 1e308 is more than 1e6") && e.len() < 300,
            "{e}"
        );
        let w = load(&one("add", "", "").replace("2.0", "1e6")).unwrap();
        assert_eq!(fmt_factor(w.waivers[0].factor.unwrap()), "1000000");
        assert_eq!(fmt_factor(1e300), "1e300");
        assert_eq!(fmt_factor(2.5), "2.5");
    }
}
