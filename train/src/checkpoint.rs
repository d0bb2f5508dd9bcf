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

use std::path::{Path, PathBuf};

use polychip_host::DType;
use serde::{Deserialize, Serialize};

use crate::config::{ModelConfig, TrainConfig};
use crate::error::{Result, TrainError};
use crate::model::Stage;
use crate::safetensors::{SafeTensors, StoredTensor};

/// The format tag in every manifest.
pub const FORMAT: &str = "polychip-checkpoint/1";

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
    let mut st = SafeTensors::new();
    for p in stage.params() {
        let name = &p.spec.name;
        st.insert(name.clone(), f32_tensor(&p.value)?)?;
        st.insert(format!("{name}.exp_avg"), f32_tensor(&p.exp_avg)?)?;
        st.insert(format!("{name}.exp_avg_sq"), f32_tensor(&p.exp_avg_sq)?)?;
    }
    write_tensors(root, step, &st, index, stages)
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
    tensors.save(&dir.join(stage_file(index, stages)))
}

/// Second half, on rank 0 after every writer finished: the manifest, the
/// rename to `step-N/` and the new `latest`.
pub fn commit(root: &Path, manifest: &Manifest) -> Result<PathBuf> {
    let partial = partial_dir(root, manifest.step);
    for f in &manifest.files {
        let p = partial.join(f);
        if !p.is_file() {
            return Err(TrainError::Checkpoint {
                path: p,
                message: "a stage's file is missing; the checkpoint was not committed".into(),
            });
        }
    }
    let text = serde_json::to_string_pretty(manifest).expect("a manifest serializes");
    write_atomic(&partial.join("manifest.json"), text.as_bytes())?;
    let done = step_dir(root, manifest.step);
    if done.exists() {
        std::fs::remove_dir_all(&done).map_err(|e| TrainError::io(&done, e))?;
    }
    std::fs::rename(&partial, &done).map_err(|e| TrainError::io(&done, e))?;
    let name = done.file_name().expect("a step dir has a name");
    write_atomic(&root.join("latest"), name.as_encoded_bytes())?;
    Ok(done)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| TrainError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| TrainError::io(path, e))?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
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

/// Reads `path` as [`load`] does, whatever model it holds (the manifest
/// says which).
pub fn open(path: &Path) -> Result<Loaded> {
    let (dir, manifest) = read_manifest(path)?;
    load_files(dir, manifest)
}

fn load_files(dir: PathBuf, manifest: Manifest) -> Result<Loaded> {
    let mut tensors = Vec::new();
    for f in &manifest.files {
        let p = dir.join(f);
        tensors.push((p.clone(), SafeTensors::load(&p)?));
    }
    Ok(Loaded {
        dir,
        manifest,
        tensors,
    })
}

/// The step directory `path` names (itself, or its root's `latest`) and its
/// manifest, checked: the format, a valid model shape, plain file names.
pub fn read_manifest(path: &Path) -> Result<(PathBuf, Manifest)> {
    let err = |p: &Path, m: String| TrainError::Checkpoint {
        path: p.to_path_buf(),
        message: m,
    };
    let dir = if path.join("manifest.json").is_file() {
        path.to_path_buf()
    } else if path.join("latest").is_file() {
        let latest = path.join("latest");
        let name = std::fs::read_to_string(&latest).map_err(|e| TrainError::io(&latest, e))?;
        path.join(name.trim())
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
    let text = std::fs::read_to_string(&mpath).map_err(|e| TrainError::io(&mpath, e))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| err(&mpath, format!("is not a valid manifest: {e}")))?;
    if manifest.format != FORMAT {
        return Err(err(
            &mpath,
            format!(
                "has format {:?}; this build reads {FORMAT:?}",
                manifest.format
            ),
        ));
    }
    manifest
        .model
        .validate()
        .map_err(|m| err(&mpath, format!("has an unusable model: {m}")))?;
    if let Some(f) = manifest
        .files
        .iter()
        .find(|f| Path::new(f).file_name() != Some(std::ffi::OsStr::new(f.as_str())))
    {
        return Err(err(
            &mpath,
            format!("names stage file {f:?}, which is not a plain file name"),
        ));
    }
    Ok((dir, manifest))
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
        for p in stage.params() {
            let name = &p.spec.name;
            for (suffix, t) in [
                ("", &p.value),
                (".exp_avg", &p.exp_avg),
                (".exp_avg_sq", &p.exp_avg_sq),
            ] {
                let key = format!("{name}{suffix}");
                let Some((path, st)) = self
                    .tensors
                    .iter_mut()
                    .find(|(_, st)| st.tensors.contains_key(&key))
                else {
                    return Err(TrainError::Checkpoint {
                        path: self.dir.clone(),
                        message: format!("has no tensor {key}"),
                    });
                };
                let mut data = st.take(path, &key, DType::F32, &p.spec.shape)?;
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
}
