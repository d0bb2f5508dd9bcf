//! A checkpoint's `latest` file and manifest from arbitrary bytes, read as
//! `polychip train --resume` reads them. The manifest's checksum is
//! recomputed over the input first (when it has one), so the fuzzer gets
//! past it to the parsing and the checks behind it: format, model shape,
//! step against the directory's name, stage-file names (plain, distinct,
//! each with a length and checksum). Each must be accepted or refused with
//! an error, never panic.

use std::path::PathBuf;
use std::sync::OnceLock;

use polychip_train::checkpoint;
use polychip_train::files;

/// The manifest's seal, as the checkpoint writer spells it.
const SEAL: &[u8] = b"\"checksum\": \"";

fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("polychip-fuzz-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(root.join("step-00000007")).expect("a scratch directory");
        root
    })
}

/// One input: a mode byte (even: the manifest of `step-00000007`, read through
/// the step directory; odd: the root's `latest`, then what it names).
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let root = root();
    let step = root.join("step-00000007");
    if mode % 2 == 0 {
        let mut bytes = rest.to_vec();
        if let Ok(Some(s)) = files::find_seal(&bytes, SEAL) {
            bytes[s.at..s.at + files::SEAL_DIGITS].fill(b'0');
            files::seal(&mut bytes, SEAL);
        }
        std::fs::write(step.join("manifest.json"), &bytes).expect("scratch write");
        let _ = checkpoint::open(&step);
    } else {
        let _ = std::fs::remove_file(step.join("manifest.json"));
        std::fs::write(root.join("latest"), rest).expect("scratch write");
        let _ = checkpoint::read_manifest(root);
        let _ = std::fs::remove_file(root.join("latest"));
    }
}
