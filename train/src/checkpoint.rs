//! Training checkpoints: a directory per saved step holding one
//! safetensors file per pipeline stage (weights under their LLaMA names,
//! AdamW moments under `<name>.exp_avg` / `<name>.exp_avg_sq`) and a
//! `manifest.json`; a `latest` file names the newest complete one.
//!
//! Saving is all-or-nothing: stages write into `step-N.partial/`, and only
//! after every rank has written does rank 0 write the manifest, rename the
//! directory to `step-N/` and replace `latest` (write, fsync, rename). A job
//! that dies while saving leaves the previous checkpoint as `latest`.
//! Because tensors are stored by name, a checkpoint loads into any other
//! split of the model over stages.
//!
//! Loading trusts nothing it reads: the manifest carries a CRC-64 of its own
//! bytes and the length and whole-file CRC-64 of every stage file, each
//! stage file a CRC-64 of all of its bytes (header included); `latest` must
//! name a `step-N` directory of the root, and every file read must be a
//! regular file inside the step directory (no symbolic link, FIFO or
//! device), read no further than the size it should have. Checksums are
//! checked before the bytes are parsed, so a foreign file is refused
//! without being quoted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use polychip_host::DType;
use serde::{Deserialize, Serialize};

use crate::config::{ModelConfig, TrainConfig};
use crate::error::{Result, TrainError};
use crate::files::{self, Links};
use crate::model::Stage;
use crate::safetensors::{Header, SafeTensors, StoredTensor};

/// The format tag in every manifest. Version 1 (no manifest checksum, stage
/// files checksummed over their data only) is no longer read.
pub const FORMAT: &str = "polychip-checkpoint/2";

/// The largest `manifest.json` read.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// The largest `latest` file read.
const MAX_LATEST_BYTES: u64 = 256;

/// How the manifest's own checksum begins in its bytes.
const MANIFEST_SEAL: &[u8] = b"\"checksum\": \"";

/// The length and whole-file checksum of one stage file, as the manifest
/// records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSum {
    /// The file's name (one of [`Manifest::files`], in the same order).
    pub file: String,
    /// Its length in bytes.
    pub bytes: u64,
    /// The CRC-64 its header records for the whole file, 16 hex digits.
    pub crc64: String,
}

/// What a checkpoint directory's `manifest.json` says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// Optimizer steps completed.
    pub step: u64,
    /// The model's shape.
    pub model: ModelConfig,
    /// The training settings it was saved with.
    pub train: TrainConfig,
    /// The plan it was saved from (for information).
    pub plan: String,
    /// Its stage files.
    pub files: Vec<String>,
    /// The length and checksum of each of [`Manifest::files`]; filled in by
    /// [`commit`] (give it empty).
    #[serde(default)]
    pub sums: Vec<FileSum>,
}

/// The directory of step `step` under `root`.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

fn partial_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}.partial"))
}

/// The file stage `stage` of `stages` writes.
pub fn stage_file(stage: usize, stages: usize) -> String {
    format!("stage-{stage:02}-of-{stages:02}.safetensors")
}

fn f32_tensor(t: &polychip_host::Tensor) -> Result<StoredTensor> {
    let mut data = t.read_bytes()?;
    if cfg!(target_endian = "big") {
        for c in data.chunks_exact_mut(4) {
            c.reverse();
        }
    }
    Ok(StoredTensor {
        dtype: DType::F32,
        shape: t.shape().to_vec(),
        data,
    })
}

/// First half of a save, on every rank that writes (one replica's stages):
/// writes this stage's file into the partial directory of `step`.
pub fn write_stage(
    root: &Path,
    step: u64,
    stage: &Stage,
    index: usize,
    stages: usize,
) -> Result<()> {
    let all: Vec<usize> = (0..stage.params().len()).collect();
    write_tensors(root, step, &param_tensors(stage, &all)?, index, stages)
}

/// The weights and AdamW moments of `stage`'s parameters `which`
/// (indices into [`Stage::params`]) on the host, under the names a
/// checkpoint gives them.
pub(crate) fn param_tensors(stage: &Stage, which: &[usize]) -> Result<SafeTensors> {
    let mut st = SafeTensors::new();
    for p in which.iter().map(|&i| &stage.params()[i]) {
        let name = &p.spec.name;
        // A part of a parameter cut by width is saved under its place in
        // the whole (`@axis:start..end`); loading joins the parts.
        let tag = p.spec.part.as_ref().map(|x| x.tag()).unwrap_or_default();
        st.insert(format!("{name}{tag}"), f32_tensor(&p.value)?)?;
        st.insert(format!("{name}.exp_avg{tag}"), f32_tensor(&p.exp_avg)?)?;
        st.insert(
            format!("{name}.exp_avg_sq{tag}"),
            f32_tensor(&p.exp_avg_sq)?,
        )?;
    }
    Ok(st)
}

/// [`write_stage`] of tensors already on the host (weights under their
/// names, moments under `.exp_avg` / `.exp_avg_sq`): an imported model.
pub fn write_tensors(
    root: &Path,
    step: u64,
    tensors: &SafeTensors,
    index: usize,
    stages: usize,
) -> Result<()> {
    let dir = partial_dir(root, step);
    std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    // Never write through a link planted in the checkpoint directory.
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => {
            return Err(TrainError::Checkpoint {
                path: dir,
                message: "is not a directory (a symbolic link?); the checkpoint was not \
                          written through it"
                    .into(),
            });
        }
        Err(e) => return Err(TrainError::io(&dir, e)),
    }
    let saved = tensors.save(&dir.join(stage_file(index, stages)));
    if saved.is_err() {
        // Nothing of a failed save stays behind (a full disk): the file's
        // temporary one is gone already, and the directory goes too when
        // no other stage wrote into it.
        let _ = std::fs::remove_dir(&dir);
    }
    saved
}

/// Removes what a failed save of `step` left in `root` (its partial
/// directory), after the save's error has been taken: the previous
/// checkpoint stays `latest`.
pub fn discard_partial(root: &Path, step: u64) {
    let _ = std::fs::remove_dir_all(partial_dir(root, step));
}

/// The checkpoints already in `root`: its `latest` and its step
/// directories (finished or `.partial`), by name; empty when `root` does
/// not exist.
fn held(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n == "latest" || step_of_name(n.strip_suffix(".partial").unwrap_or(n)).is_some()
        })
        .collect();
    names.sort();
    names
}

/// Refuses `root` as a new run's checkpoint directory when it already
/// holds checkpoints (a `latest` or a step directory) and the run does not
/// resume from it (`resume`, the run's `--resume`, is `root` or one of its
/// step directories): the new run would replace the old one's steps one by
/// one and move `latest` back to its own.
pub fn check_root_for_run(root: &Path, resume: Option<&Path>) -> Result<()> {
    let names = held(root);
    if names.is_empty() {
        return Ok(());
    }
    let same = |a: &Path| match (a.canonicalize(), root.canonicalize()) {
        (Ok(a), Ok(r)) => a == r,
        _ => false,
    };
    if let Some(r) = resume
        && (same(r) || r.parent().is_some_and(same))
    {
        return Ok(());
    }
    // Read as `open` reads it: a regular file of a few bytes, never a
    // FIFO or a link; named only when it names a step.
    let latest = files::read_regular(&root.join("latest"), Links::Refuse, MAX_LATEST_BYTES)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|l| step_of_name(l.trim()).is_some());
    let what = match latest {
        Some(l) => format!("latest: {}", l.trim()),
        None => names.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
    };
    Err(TrainError::Checkpoint {
        path: root.to_path_buf(),
        message: format!(
            "already holds another run's checkpoints ({what}); to go on with that run give \
             --resume {}, or save into an empty or new directory",
            polychip_files::shown_path(root)
        ),
    })
}

/// The lock a run holds on its checkpoint directory while it trains
/// ([`RootLock::take`]): released when dropped or when the process ends,
/// however it ends.
#[derive(Debug)]
pub struct RootLock {
    _file: std::fs::File,
}

impl RootLock {
    /// Makes `root` if needed and locks it for this run (an advisory
    /// `flock` on `root/.lock`, taken by the rank that commits the
    /// checkpoints), so that a second run saving into the same directory
    /// at the same time is refused instead of interleaving its steps with
    /// this one's.
    pub fn take(root: &Path) -> Result<RootLock> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(root).map_err(|e| TrainError::io(root, e))?;
        check_lock_file(root).map_err(|message| TrainError::Checkpoint {
            path: root.to_path_buf(),
            message,
        })?;
        let path = root.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| TrainError::io(&path, e))?;
        // SAFETY: flock on a descriptor this function owns; no memory is
        // passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            let message = if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                "another run is saving its checkpoints here now; give this one its own \
                 --checkpoint-dir"
                    .to_string()
            } else {
                format!("cannot be locked for this run: {e}")
            };
            return Err(TrainError::Checkpoint {
                path: root.to_path_buf(),
                message,
            });
        }
        remove_debris(root);
        Ok(RootLock { _file: file })
    }
}

/// Removes what interrupted saves left in `root` (run under its lock, so
/// no other run writes there, and before this run's first save): the
/// `step-N.partial/` directories of saves killed before their rename (each
/// holds stage files, weights and moments: repeated interruptions leaked
/// disk) and the temporary files of `latest` written and not yet renamed
/// (`.latest.tmp-PID`). A finished step and `latest` itself are never
/// touched; what cannot be removed is left, as before.
fn remove_debris(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        let Ok(kind) = e.file_type() else { continue };
        let partial = kind.is_dir()
            && n.strip_suffix(".partial")
                .is_some_and(|stem| step_of_name(stem).is_some());
        let latest_tmp = kind.is_file()
            && n.strip_prefix(".latest.tmp-")
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if partial {
            let _ = std::fs::remove_dir_all(e.path());
        } else if latest_tmp {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The name of the lock file in a checkpoint directory.
pub const LOCK_FILE: &str = ".lock";

/// Refuses a checkpoint directory `root` whose lock file is there and is not
/// a regular file (a directory, a link that would make the lock elsewhere,
/// a FIFO): checked before the first step, and again when the lock is taken.
pub fn check_lock_file(root: &Path) -> std::result::Result<(), String> {
    match std::fs::symlink_metadata(root.join(LOCK_FILE)) {
        Ok(m) if !m.file_type().is_file() => Err(format!(
            "its lock file {LOCK_FILE} is {}, not a file: a run locks the directory through \
             it; remove it, or give this run another --checkpoint-dir",
            polychip_files::kind(m.file_type())
        )),
        _ => Ok(()),
    }
}

/// Second half, on rank 0 after every writer finished: the manifest, the
/// rename to `step-N/` and the new `latest`.
pub fn commit(root: &Path, manifest: &Manifest) -> Result<PathBuf> {
    let partial = partial_dir(root, manifest.step);
    let mut manifest = manifest.clone();
    manifest.sums.clear();
    for f in &manifest.files {
        let p = partial.join(f);
        if !p.is_file() {
            return Err(TrainError::Checkpoint {
                path: p,
                message: "a stage's file is missing; the checkpoint was not committed".into(),
            });
        }
        let h = Header::read(&p)?;
        let crc = h.checksum().ok_or_else(|| TrainError::Checkpoint {
            path: p.clone(),
            message: "has no checksum; the checkpoint was not committed".into(),
        })?;
        manifest.sums.push(FileSum {
            file: f.clone(),
            bytes: h.data_start + h.data_len,
            crc64: format!("{crc:016x}"),
        });
    }
    let mut value = serde_json::to_value(&manifest).expect("a manifest serializes");
    value
        .as_object_mut()
        .expect("an object")
        .insert("checksum".into(), "0".repeat(files::SEAL_DIGITS).into());
    let mut text = serde_json::to_string_pretty(&value)
        .expect("a manifest serializes")
        .into_bytes();
    files::seal(&mut text, MANIFEST_SEAL);
    write_atomic(&partial.join("manifest.json"), &text)?;
    let done = step_dir(root, manifest.step);
    let mut replaced = false;
    if done.exists() {
        // Saving a step again (after resuming from an earlier one): swap
        // the directories in one step, so that the `step-N` that `latest`
        // may name is never missing, and remove the old one after.
        replaced = exchange(&partial, &done).is_ok();
        if !replaced {
            std::fs::remove_dir_all(&done).map_err(|e| TrainError::io(&done, e))?;
        }
    }
    if !replaced {
        std::fs::rename(&partial, &done).map_err(|e| TrainError::io(&done, e))?;
    }
    let name = done.file_name().expect("a step dir has a name");
    write_atomic(&root.join("latest"), name.as_encoded_bytes())?;
    if replaced {
        std::fs::remove_dir_all(&partial).map_err(|e| TrainError::io(&partial, e))?;
    }
    Ok(done)
}

/// Swaps two directories atomically (Linux `renameat2` with
/// `RENAME_EXCHANGE`); an error where the file system cannot.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call;
    // renameat2 reads them and touches no memory of ours.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes `bytes` to `path` whole or not at all
/// ([`polychip_files::write_atomic`]: a private temporary file beside it,
/// synced, renamed over it, removed again on failure).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    polychip_files::write_atomic(path, bytes).map_err(|e| TrainError::io(path, e))
}

/// A checkpoint read from disk: its manifest and every stage's tensors.
#[derive(Debug)]
pub struct Loaded {
    /// The step directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// All tensors of all its files, with the file each came from.
    pub tensors: Vec<(PathBuf, SafeTensors)>,
}

/// Reads `path`: a step directory, or a root whose `latest` names one.
/// Refuses a checkpoint of another model shape, naming the field.
pub fn load(path: &Path, model: &ModelConfig) -> Result<Loaded> {
    let (dir, manifest) = read_manifest(path)?;
    if let Some(diff) = model_difference(&manifest.model, model) {
        return Err(TrainError::Checkpoint {
            path: dir,
            message: format!(
                "holds a different model: {diff}; train with the same model shape to load it"
            ),
        });
    }
    load_files(dir, manifest)
}

/// [`load`] for resuming training with `train`: also refuses a checkpoint
/// saved with other training settings ([`train_differences`]) unless
/// `allow_changes`, and one at or past `train.steps`. Returns the
/// checkpoint and the settings that differ (allowed).
pub fn load_for_resume(
    path: &Path,
    model: &ModelConfig,
    train: &TrainConfig,
    allow_changes: bool,
) -> Result<(Loaded, Vec<String>)> {
    let (dir, manifest) = read_manifest(path)?;
    let refuse = |message: String| TrainError::Checkpoint {
        path: dir.clone(),
        message,
    };
    if let Some(diff) = model_difference(&manifest.model, model) {
        return Err(refuse(format!(
            "holds a different model: {diff}; train with the same model shape to load it"
        )));
    }
    if train.steps <= manifest.step {
        return Err(refuse(format!(
            "is at step {}, and --steps is {}: nothing is left to train (steps must be \
             more than the checkpoint's step)",
            manifest.step, train.steps
        )));
    }
    let diffs = train_differences(&manifest.train, train, manifest.step);
    if !diffs.is_empty() && !allow_changes {
        return Err(refuse(format!(
            "was saved with other training settings: {}; resume with the same settings, \
             or pass --allow-changed-settings to continue with the new ones",
            diffs.join("; ")
        )));
    }
    let loaded = load_files(dir, manifest)?;
    check_contents(&loaded.manifest.model, &loaded.tensors)?;
    Ok((loaded, diffs))
}

/// The training settings in which `now` differs from the `saved` ones of a
/// checkpoint at `step`, as `field (--flag) is A in the checkpoint but B
/// now`: those that change the run's course (the schedule's rates and
/// warm-up, AdamW's constants, clipping, the batch, the seed of the data
/// order, the precision). `steps` and the validation settings may change.
/// A step-0 checkpoint (an import) has taken no step: nothing differs.
pub fn train_differences(saved: &TrainConfig, now: &TrainConfig, step: u64) -> Vec<String> {
    if step == 0 {
        return Vec::new();
    }
    // Through JSON as the saved values were, so that equal values compare
    // equal whatever the float parser's rounding.
    let now: TrainConfig = serde_json::to_string(now)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| now.clone());
    let mut out = Vec::new();
    let mut f = |field: &str, flag: &str, a: String, b: String| {
        if a != b {
            let flag = if flag.is_empty() {
                String::new()
            } else {
                format!(" ({flag})")
            };
            out.push(format!(
                "{field}{flag} is {a} in the checkpoint but {b} now"
            ));
        }
    };
    let g = |v: f64| format!("{v:?}");
    f("lr", "--lr", g(saved.lr), g(now.lr));
    f("min_lr", "", g(saved.min_lr), g(now.min_lr));
    f(
        "warmup",
        "",
        saved.warmup.to_string(),
        now.warmup.to_string(),
    );
    f(
        "weight_decay",
        "",
        g(saved.weight_decay),
        g(now.weight_decay),
    );
    f("beta1", "", g(saved.beta1), g(now.beta1));
    f("beta2", "", g(saved.beta2), g(now.beta2));
    f("eps", "", g(saved.eps), g(now.eps));
    f("clip", "", g(saved.clip), g(now.clip));
    f(
        "global_batch",
        "--global-batch",
        saved.global_batch.to_string(),
        now.global_batch.to_string(),
    );
    f(
        "seed",
        "--seed",
        saved.seed.to_string(),
        now.seed.to_string(),
    );
    f(
        "precision",
        "--precision",
        format!("{:?}", saved.precision).to_lowercase(),
        format!("{:?}", now.precision).to_lowercase(),
    );
    out
}

/// Reads `path` as [`load`] does, whatever model it holds (the manifest
/// says which).
pub fn open(path: &Path) -> Result<Loaded> {
    let (dir, manifest) = read_manifest(path)?;
    load_files(dir, manifest)
}

fn load_files(dir: PathBuf, manifest: Manifest) -> Result<Loaded> {
    let mut tensors = Vec::new();
    for (f, sum) in manifest.files.iter().zip(&manifest.sums) {
        let p = dir.join(f);
        let (st, crc) = SafeTensors::load_sealed(&p, sum.bytes)?;
        if format!("{crc:016x}") != sum.crc64 {
            return Err(TrainError::Checkpoint {
                path: p,
                message: format!(
                    "has checksum {crc:016x} but the manifest records {} for it: it is \
                     not the file this checkpoint saved",
                    sum.crc64
                ),
            });
        }
        tensors.push((p, st));
    }
    join_parts(&mut tensors)?;
    Ok(Loaded {
        dir,
        manifest,
        tensors,
    })
}

/// Refuses a stage file's tensor that the manifest's model does not have
/// (a checkpoint of a larger model under a smaller manifest resumed
/// truncated, silently), and values no run saves: a weight or moment that
/// is not finite, a negative second moment. Such a checkpoint used to load
/// and diverge a step later, blamed on the learning rate.
pub(crate) fn check_contents(
    model: &ModelConfig,
    tensors: &[(PathBuf, SafeTensors)],
) -> Result<()> {
    use std::collections::BTreeSet;
    let whole = crate::params::StageRange::whole(model);
    let mut known: BTreeSet<String> = BTreeSet::new();
    for spec in crate::params::stage_params(model, &whole) {
        known.insert(format!("{}.exp_avg", spec.name));
        known.insert(format!("{}.exp_avg_sq", spec.name));
        known.insert(spec.name);
    }
    for (path, st) in tensors {
        let refuse = |message: String| TrainError::Checkpoint {
            path: path.clone(),
            message,
        };
        for (key, t) in &st.tensors {
            if !known.contains(key) {
                return Err(refuse(format!(
                    "has tensor `{}`, which the checkpoint's model ({} layers of width {}) does \
                     not have",
                    polychip_files::printable(key),
                    model.layers,
                    model.dim
                )));
            }
            if t.dtype != DType::F32 {
                continue; // refused by name and type when restored
            }
            let second_moment = key.ends_with(".exp_avg_sq");
            let bad = t.data.chunks_exact(4).enumerate().find_map(|(i, c)| {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                (!v.is_finite() || (second_moment && v < 0.0)).then_some((i, v))
            });
            if let Some((i, v)) = bad {
                let what = match (key.ends_with(".exp_avg") || second_moment, v.is_finite()) {
                    (true, true) => "a negative second moment of AdamW (a square's average)",
                    (true, false) => "an AdamW moment that is not finite",
                    (false, _) => "a weight that is not finite",
                };
                return Err(refuse(format!(
                    "has {what}: tensor `{key}` element {i} is {v} (of {}); no run saves one, so \
                     the file was damaged or edited",
                    t.data.len() / 4
                )));
            }
        }
    }
    Ok(())
}

/// One saved part of a tensor cut by width:
/// `NAME@AXIS:START..END/WHOLE`.
struct SavedPart {
    file: usize,
    key: String,
    axis: usize,
    start: usize,
    end: usize,
    whole: usize,
}

/// Reads `key` as a part, `NAME@AXIS:START..END/WHOLE`: the name and the
/// part's axis, start, end and whole extent.
fn parse_part(key: &str) -> Option<(&str, [usize; 4])> {
    let (name, at) = key.rsplit_once('@')?;
    let (axis, span) = at.split_once(':')?;
    let (span, whole) = span.split_once('/')?;
    let (a, b) = span.split_once("..")?;
    let num = |x: &str| {
        (!x.is_empty() && x.bytes().all(|c| c.is_ascii_digit()))
            .then(|| x.parse::<usize>().ok())
            .flatten()
    };
    Some((name, [num(axis)?, num(a)?, num(b)?, num(whole)?]))
}

/// Joins the parts that stages holding a half cut by its width saved
/// (`NAME@AXIS:START..END/WHOLE`, see [`crate::params::Part`]) into the
/// whole tensor `NAME`, kept in the first part's file: a checkpoint then
/// reads alike whatever split saved it. Parts must be matrices cut along
/// one axis (0 or 1) into consecutive, non-empty ranges covering exactly
/// `0..WHOLE`, alike in type and in their other axis, and `NAME` must not
/// also be saved whole; anything else is refused, naming the tensor and
/// the file.
pub(crate) fn join_parts(tensors: &mut [(PathBuf, SafeTensors)]) -> Result<()> {
    let mut parts: BTreeMap<String, Vec<SavedPart>> = BTreeMap::new();
    for (file, (path, st)) in tensors.iter().enumerate() {
        for key in st.tensors.keys() {
            let Some((name, [axis, start, end, whole])) = parse_part(key) else {
                if key.contains('@') {
                    return Err(TrainError::Checkpoint {
                        path: path.clone(),
                        message: format!(
                            "has a tensor `{key}` that is not a part \
                             (NAME@AXIS:START..END/WHOLE)"
                        ),
                    });
                }
                continue;
            };
            parts.entry(name.to_string()).or_default().push(SavedPart {
                file,
                key: key.clone(),
                axis,
                start,
                end,
                whole,
            });
        }
    }
    for (name, mut list) in parts {
        list.sort_by_key(|p| (p.start, p.end));
        let path_of = |p: &SavedPart| tensors[p.file].0.clone();
        let bad = |p: &SavedPart, what: String| TrainError::Checkpoint {
            path: path_of(p),
            message: format!("has a part `{}` of `{name}` that {what}", p.key),
        };
        if let Some((path, _)) = tensors
            .iter()
            .find(|(_, st)| st.tensors.contains_key(&name))
        {
            return Err(TrainError::Checkpoint {
                path: path.clone(),
                message: format!(
                    "holds `{name}` whole, and the checkpoint holds parts of it too \
                     ({}): which is its value is not clear",
                    list[0].key
                ),
            });
        }
        let (axis, whole) = (list[0].axis, list[0].whole);
        let mut pieces: Vec<(StoredTensor, usize)> = Vec::with_capacity(list.len());
        let mut next = 0;
        for p in &list {
            let t = tensors[p.file].1.tensors.get(&p.key).expect("listed");
            if p.axis > 1 {
                return Err(bad(
                    p,
                    format!("is cut along axis {}; a matrix has axes 0 and 1", p.axis),
                ));
            }
            if p.axis != axis || p.whole != whole {
                return Err(bad(
                    p,
                    format!(
                        "is cut along axis {} of {}, where `{}` is cut along axis {axis} of \
                         {whole}",
                        p.axis, p.whole, list[0].key
                    ),
                ));
            }
            if t.shape.len() != 2 {
                return Err(bad(
                    p,
                    format!(
                        "is {}, not a matrix (only matrices are cut)",
                        crate::safetensors::show_shape(&t.shape)
                    ),
                ));
            }
            if p.end <= p.start {
                return Err(bad(p, format!("is empty ({}..{})", p.start, p.end)));
            }
            if p.start != next {
                let what = match p.start < next {
                    true => format!("overlaps the part before it, which ends at {next}"),
                    false => format!("leaves {next}..{} of {whole} missing", p.start),
                };
                return Err(bad(p, what));
            }
            if p.end > whole {
                return Err(bad(p, format!("runs past the whole's {whole}")));
            }
            let held = i64::try_from(p.end - p.start).ok();
            if t.shape.get(axis).copied() != held {
                return Err(bad(
                    p,
                    format!(
                        "is {}, which does not hold {}..{} along axis {axis}",
                        crate::safetensors::show_shape(&t.shape),
                        p.start,
                        p.end
                    ),
                ));
            }
            if let Some((first, _)) = pieces.first()
                && (t.dtype != first.dtype || t.shape[1 - axis] != first.shape[1 - axis])
            {
                return Err(bad(
                    p,
                    format!(
                        "is {} {}, unlike `{}` ({} {})",
                        t.dtype,
                        crate::safetensors::show_shape(&t.shape),
                        list[0].key,
                        first.dtype,
                        crate::safetensors::show_shape(&first.shape)
                    ),
                ));
            }
            next = p.end;
            pieces.push((t.clone(), p.end - p.start));
        }
        if next != whole {
            let last = list.last().expect("a part");
            return Err(bad(
                last,
                format!("leaves {next}..{whole} of {whole} missing"),
            ));
        }
        for p in &list {
            tensors[p.file].1.tensors.remove(&p.key);
        }
        let first = &pieces[0].0;
        let (dtype, other) = (first.dtype, first.shape[1 - axis] as usize);
        let size = dtype.size();
        let mut data = Vec::with_capacity(pieces.iter().map(|(t, _)| t.data.len()).sum());
        match axis {
            0 => pieces
                .iter()
                .for_each(|(t, _)| data.extend_from_slice(&t.data)),
            _ => {
                for row in 0..other {
                    for (t, w) in &pieces {
                        data.extend_from_slice(&t.data[row * w * size..(row + 1) * w * size]);
                    }
                }
            }
        }
        let mut shape = vec![other as i64; 2];
        shape[axis] = whole as i64;
        let joined = StoredTensor { dtype, shape, data };
        tensors[list[0].file].1.insert(name, joined)?;
    }
    Ok(())
}

/// The step directory `path` names (itself, or its root's `latest`) and its
/// manifest, checked: its checksum (before it is parsed), the format, a
/// valid model shape, the step its directory's name says, plain file names
/// with a length and checksum each. `latest` must name a `step-N`
/// directory of the root itself (no path, no symbolic link); the manifest
/// must be a regular file, not a link.
pub fn read_manifest(path: &Path) -> Result<(PathBuf, Manifest)> {
    let err = |p: &Path, m: String| TrainError::Checkpoint {
        path: p.to_path_buf(),
        message: m,
    };
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    let dir = if exists(&path.join("manifest.json")) {
        path.to_path_buf()
    } else if exists(&path.join("latest")) {
        let latest = path.join("latest");
        let bytes = files::read_regular(&latest, Links::Refuse, MAX_LATEST_BYTES)?;
        let name = std::str::from_utf8(&bytes)
            .ok()
            .map(str::trim)
            .filter(|n| step_of_name(n).is_some())
            .ok_or_else(|| {
                err(
                    &latest,
                    format!(
                        "does not name a step directory: it should hold `step-` and the \
                         step's digits, as polychip writes it, but holds {} other bytes",
                        bytes.len()
                    ),
                )
            })?;
        let dir = path.join(name);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_dir() => dir,
            Ok(m) if m.file_type().is_symlink() => {
                return Err(err(
                    &dir,
                    "(named by latest) is a symbolic link; a checkpoint's step directory \
                     must be inside it"
                        .into(),
                ));
            }
            Ok(_) => return Err(err(&dir, "(named by latest) is not a directory".into())),
            Err(e) => return Err(TrainError::io(&dir, e)),
        }
    } else if path.is_file() {
        return Err(err(
            path,
            "is a file; give the checkpoint's step directory (the one holding its \
             manifest.json) or the checkpoint root (holding `latest`)"
                .into(),
        ));
    } else if path.exists() {
        return Err(err(
            path,
            "is neither a checkpoint step directory (no manifest.json) nor a checkpoint \
             root (no latest file)"
                .into(),
        ));
    } else {
        return Err(err(path, "does not exist".into()));
    };
    let mpath = dir.join("manifest.json");
    let bytes = files::read_regular(&mpath, Links::Refuse, MAX_MANIFEST_BYTES)?;
    if let Err(m) = files::check_seal(&bytes, MANIFEST_SEAL) {
        let v1 = b"\"format\": \"polychip-checkpoint/1\"";
        if bytes.windows(v1.len()).any(|w| w == v1) {
            return Err(err(
                &mpath,
                format!(
                    "has format \"polychip-checkpoint/1\" (an earlier polychip's, without \
                     checksums of the manifest and of whole files); this build reads \
                     {FORMAT:?}"
                ),
            ));
        }
        return Err(err(&mpath, m));
    }
    let mut value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| err(&mpath, format!("is not valid JSON: {e}")))?;
    if let Some(o) = value.as_object_mut() {
        o.remove("checksum");
    }
    let manifest: Manifest = serde_json::from_value(value)
        .map_err(|e| err(&mpath, format!("is not a valid manifest: {e}")))?;
    if manifest.format != FORMAT {
        return Err(err(
            &mpath,
            format!(
                "has format {}; this build reads {FORMAT:?}",
                polychip_comm::text::quoted(&manifest.format)
            ),
        ));
    }
    manifest
        .model
        .validate()
        .map_err(|m| err(&mpath, format!("has an unusable model: {m}")))?;
    if let Some(n) = dir.file_name().and_then(|n| step_of_name(n.to_str()?))
        && n != manifest.step
    {
        return Err(err(
            &mpath,
            format!("says step {} but its directory is step {n}", manifest.step),
        ));
    }
    if let Some(f) = manifest
        .files
        .iter()
        .find(|f| Path::new(f).file_name() != Some(std::ffi::OsStr::new(f.as_str())))
    {
        return Err(err(
            &mpath,
            format!(
                "names stage file {}, which is not a plain file name",
                polychip_comm::text::quoted(f)
            ),
        ));
    }
    let mut names: Vec<&String> = manifest.files.iter().collect();
    names.sort();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(
            &mpath,
            format!(
                "names stage file {} twice",
                polychip_comm::text::quoted(w[0])
            ),
        ));
    }
    let listed: Vec<&String> = manifest.sums.iter().map(|s| &s.file).collect();
    if listed != manifest.files.iter().collect::<Vec<_>>() {
        return Err(err(
            &mpath,
            "does not record a length and checksum for exactly its stage files".into(),
        ));
    }
    Ok((dir, manifest))
}

/// The step of a directory name `step-N` (digits only), if it is one.
fn step_of_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The first shape field in which two models differ, as `field is A in the
/// checkpoint but B now` (the name does not count).
pub fn model_difference(saved: &ModelConfig, now: &ModelConfig) -> Option<String> {
    let pairs = [
        ("vocab", saved.vocab, now.vocab),
        ("dim", saved.dim, now.dim),
        ("layers", saved.layers, now.layers),
        ("heads", saved.heads, now.heads),
        ("kv_heads", saved.kv_heads, now.kv_heads),
        ("ffn", saved.ffn, now.ffn),
        ("seq_len", saved.seq_len, now.seq_len),
    ];
    for (field, a, b) in pairs {
        if a != b {
            return Some(format!("{field} is {a} in the checkpoint but {b} now"));
        }
    }
    if saved.norm_eps != now.norm_eps || saved.rope_theta != now.rope_theta {
        return Some("norm_eps or rope_theta differ".into());
    }
    None
}

impl Loaded {
    /// Copies this stage's weights and AdamW moments from the checkpoint,
    /// whatever stage split it was saved from.
    pub fn restore(&mut self, stage: &Stage) -> Result<()> {
        restore_tensors(&mut self.tensors, &self.dir, stage)
    }
}

/// Copies `stage`'s weights and AdamW moments from `tensors` (whole
/// tensors, parts joined: [`join_parts`]), whatever stages they came from;
/// errors name `dir`.
pub(crate) fn restore_tensors(
    tensors: &mut [(PathBuf, SafeTensors)],
    dir: &Path,
    stage: &Stage,
) -> Result<()> {
    for p in stage.params() {
        let name = &p.spec.name;
        for (suffix, t) in [
            ("", &p.value),
            (".exp_avg", &p.exp_avg),
            (".exp_avg_sq", &p.exp_avg_sq),
        ] {
            let key = format!("{name}{suffix}");
            let Some((path, st)) = tensors
                .iter_mut()
                .find(|(_, st)| st.tensors.contains_key(&key))
            else {
                return Err(TrainError::Checkpoint {
                    path: dir.to_path_buf(),
                    message: format!("has no tensor {key}"),
                });
            };
            let mut data = match &p.spec.part {
                None => st.take(path, &key, DType::F32, &p.spec.shape)?,
                Some(part) => {
                    // The whole stays for the other parts' stages.
                    let whole = st.take(path, &key, DType::F32, &part.full)?;
                    let sliced = part_bytes(part, &whole);
                    st.tensors.insert(
                        key.clone(),
                        StoredTensor {
                            dtype: DType::F32,
                            shape: part.full.clone(),
                            data: whole,
                        },
                    );
                    sliced
                }
            };
            if cfg!(target_endian = "big") {
                for c in data.chunks_exact_mut(4) {
                    c.reverse();
                }
            }
            t.write_bytes(&data)?;
        }
    }
    stage.refresh_compute_weights()
}

/// The bytes of `part` of a whole f32 tensor's `whole`.
fn part_bytes(part: &crate::params::Part, whole: &[u8]) -> Vec<u8> {
    let words: Vec<[u8; 4]> = whole
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect();
    part.slice(&words).concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[i64], values: impl IntoIterator<Item = f32>) -> StoredTensor {
        StoredTensor {
            dtype: DType::F32,
            shape: shape.to_vec(),
            data: values.into_iter().flat_map(f32::to_le_bytes).collect(),
        }
    }

    fn files(parts: &[(&str, &[i64], Vec<f32>)]) -> Vec<(PathBuf, SafeTensors)> {
        parts
            .iter()
            .map(|(key, shape, v)| {
                let mut st = SafeTensors::new();
                st.insert(*key, f32s(shape, v.iter().copied())).unwrap();
                (PathBuf::from(format!("{key}.safetensors")), st)
            })
            .collect()
    }

    #[test]
    fn taking_the_lock_removes_what_interrupted_saves_left() {
        let root = std::env::temp_dir().join(format!("polychip-debris-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("step-00000003.partial")).unwrap();
        std::fs::write(
            root.join("step-00000003.partial/stage-00-of-01.safetensors"),
            b"x",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("step-00000002")).unwrap();
        for (name, body) in [
            (".latest.tmp-4242", "step-00000003"),
            ("latest", "step-00000002"),
            (".latest.tmp-abc", "kept: not a pid"),
            ("notes.partial", "kept: not a step"),
        ] {
            std::fs::write(root.join(name), body).unwrap();
        }
        let lock = RootLock::take(&root).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".latest.tmp-abc",
                ".lock",
                "latest",
                "notes.partial",
                "step-00000002"
            ]
        );
        drop(lock);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn tensors_the_model_lacks_and_values_no_run_saves_are_refused() {
        let model = ModelConfig::preset("mini").unwrap();
        let spec =
            &crate::params::stage_params(&model, &crate::params::StageRange::whole(&model))[0];
        let name = spec.name.clone();
        let n = spec.numel();
        let check = |key: &str, v: Vec<f32>| {
            let shape = [v.len() as i64];
            check_contents(&model, &files(&[(key, &shape, v)]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert_eq!(check(&name, vec![0.5; n]), "");
        assert_eq!(check(&format!("{name}.exp_avg_sq"), vec![0.0; n]), "");
        let mut nan = vec![0.5; n];
        nan[3] = f32::NAN;
        let e = check(&name, nan.clone());
        assert!(
            e.contains("a weight that is not finite") && e.contains("element 3 is NaN"),
            "{e}"
        );
        let e = check(&format!("{name}.exp_avg"), nan);
        assert!(e.contains("an AdamW moment that is not finite"), "{e}");
        let e = check(&format!("{name}.exp_avg_sq"), vec![-1.0; n]);
        assert!(e.contains("a negative second moment"), "{e}");
        let e = check("layers.99.attention.wq.weight", vec![0.0; 4]);
        assert!(
            e.contains("has tensor `layers.99.attention.wq.weight`, which the checkpoint's model"),
            "{e}"
        );
    }

    #[test]
    fn parts_cut_by_width_join_into_the_whole_and_bad_parts_are_refused() {
        // A 2 x 5 matrix cut by columns 0..2 and 2..5, saved by two stages.
        let whole: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let cols = |a: usize, b: usize| -> Vec<f32> {
            (0..2)
                .flat_map(|r| whole[r * 5 + a..r * 5 + b].to_vec())
                .collect()
        };
        let mut t = files(&[
            ("w@1:2..5/5", &[2, 3], cols(2, 5)),
            ("w@1:0..2/5", &[2, 2], cols(0, 2)),
        ]);
        join_parts(&mut t).unwrap();
        let joined: Vec<&StoredTensor> = t.iter().filter_map(|(_, s)| s.tensors.get("w")).collect();
        assert_eq!(joined, vec![&f32s(&[2, 5], whole.iter().copied())]);
        assert!(t.iter().all(|(_, s)| s.tensors.keys().all(|k| k == "w")));
        // Rows likewise.
        let mut t = files(&[
            ("v.exp_avg@0:0..1/3", &[1, 2], vec![1.0, 2.0]),
            ("v.exp_avg@0:1..3/3", &[2, 2], vec![3.0, 4.0, 5.0, 6.0]),
        ]);
        join_parts(&mut t).unwrap();
        assert_eq!(
            t[0].1.tensors["v.exp_avg"],
            f32s(&[3, 2], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        let z = |n: usize| vec![0.0; n];
        for (bad, want) in [
            (
                vec![
                    ("w@1:0..2/5", &[2i64, 2][..], z(4)),
                    ("w@1:3..5/5", &[2, 2], z(4)),
                ],
                "`w@1:3..5/5` of `w` that leaves 2..3 of 5 missing",
            ),
            (
                vec![("w@1:0..2/5", &[2, 2], z(4)), ("w@1:1..3/5", &[2, 2], z(4))],
                "overlaps the part before it, which ends at 2",
            ),
            (
                vec![("w@1:0..2/5", &[2, 2], z(4)), ("w@1:2..4/5", &[2, 2], z(4))],
                "`w@1:2..4/5` of `w` that leaves 4..5 of 5 missing",
            ),
            (
                vec![("w@1:0..2/5", &[2, 2], z(4)), ("w@1:2..5/5", &[3, 3], z(9))],
                "unlike `w@1:0..2/5`",
            ),
            (
                vec![("w@1:0..2/4", &[2, 2], z(4)), ("w@1:2..6/4", &[2, 4], z(8))],
                "runs past the whole's 4",
            ),
            (vec![("w@0:0..2/2", &[2], z(2))], "is [2], not a matrix"),
            (vec![("w@5:0..2/2", &[2, 2], z(4))], "is cut along axis 5"),
            (
                vec![("w@0:0..1/2", &[1, 2], z(2)), ("w@1:1..2/2", &[2, 1], z(2))],
                "is cut along axis 1 of 2, where `w@0:0..1/2` is cut along axis 0",
            ),
            (
                vec![("w@0:0..0/2", &[0, 2], z(0)), ("w@0:0..2/2", &[2, 2], z(4))],
                "is empty (0..0)",
            ),
            (vec![("w@x", &[2], z(2))], "is not a part"),
            (vec![("w@1:0..2", &[2, 2], z(4))], "is not a part"),
            (
                vec![("w@1:1..9223372036854775809/9", &[2, 2], z(4))],
                "leaves 0..1 of 9 missing",
            ),
            (
                vec![(
                    "w@1:0..18446744073709551615/18446744073709551615",
                    &[2, 2],
                    z(4),
                )],
                "does not hold 0..18446744073709551615",
            ),
            (
                vec![("w", &[2, 2], z(4)), ("w@1:0..2/2", &[2, 2], z(4))],
                "holds `w` whole, and the checkpoint holds parts of it too",
            ),
        ] {
            let mut t = files(&bad);
            let e = join_parts(&mut t).unwrap_err().to_string();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }
}
