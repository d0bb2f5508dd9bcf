//! Who may join a job: its members prove they hold the job's secret, and
//! name the job they belong to.
//!
//! Every rank has a [`JobAuth`]: a secret and a job id. The rendezvous
//! store's handshake is a mutual challenge-response over HMAC-SHA256 (see
//! `tcp_store`): the secret never crosses the wire, a process without it is
//! refused, and a rank never talks to a server that cannot prove it holds
//! the secret (another job's store on the same port, or an impostor that
//! bound it first). The job id tells two jobs of the same user apart: a rank
//! of another job is refused by name even when both share a secret.
//!
//! Where they come from ([`JobAuth::from_env`]):
//! - `POLYCHIP_JOB_SECRET` (at least 16 bytes) and `POLYCHIP_JOB_ID`, which
//!   `polychip launch` generates for every job it starts (random, 128 bits
//!   and 64 bits) unless they are already set;
//! - under torchrun, mpirun or Slurm the secret must be set in every rank's
//!   environment (a clear error otherwise), and the job id defaults to the
//!   launcher's own (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`,
//!   `OMPI_MCA_orte_hnp_uri`...), else to none (the empty id: such jobs
//!   are told apart by their secrets only);
//! - a process started by hand or a test (no launcher): the user's own
//!   secret, a random file created once, mode 0600, in the user's runtime
//!   directory, which only processes of this user on this machine can read.
//!   So ranks of one user on one machine meet without setup, and other users
//!   are kept out.

use std::io::Read;
use std::path::PathBuf;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::env::RankInfo;
use crate::error::{CommError, Result};

/// The job's secret.
pub const SECRET_VAR: &str = "POLYCHIP_JOB_SECRET";
/// The job's name.
pub const JOB_ID_VAR: &str = "POLYCHIP_JOB_ID";
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET: usize = 16;
/// The longest job id accepted, in bytes: the most the rendezvous store's
/// handshake carries (a longer one failed that handshake on every rank,
/// naming no variable).
pub const MAX_JOB_ID: usize = 64 << 10;

/// Refuses a job id longer than [`MAX_JOB_ID`], naming `var`, the
/// variable it came from.
fn check_job_id(var: &str, job_id: &str) -> Result<()> {
    if job_id.len() > MAX_JOB_ID {
        return Err(CommError::Usage(format!(
            "{var} is {} bytes long; a job id has at most {MAX_JOB_ID} bytes (64 KiB)",
            job_id.len()
        )));
    }
    Ok(())
}

/// A job's secret and id.
#[derive(Clone, PartialEq, Eq)]
pub struct JobAuth {
    secret: Vec<u8>,
    /// The job's name, compared by the store.
    pub job_id: String,
}

impl std::fmt::Debug for JobAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("JobAuth")
            .field("job_id", &self.job_id)
            .finish_non_exhaustive()
    }
}

/// `n` random bytes from the kernel.
pub fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .map_err(|e| CommError::Io {
            rank: 0,
            op: "job secret".into(),
            message: format!("reading /dev/urandom: {e}"),
        })?;
    Ok(out)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl JobAuth {
    /// A secret and id given directly (tests, embedders). The secret has
    /// at least [`MIN_SECRET`] bytes, the id at most [`MAX_JOB_ID`].
    pub fn new(secret: impl Into<Vec<u8>>, job_id: impl Into<String>) -> Result<JobAuth> {
        let (secret, job_id) = (secret.into(), job_id.into());
        check_job_id(JOB_ID_VAR, &job_id)?;
        if secret.len() < MIN_SECRET {
            return Err(CommError::Usage(format!(
                "{SECRET_VAR} is {} bytes long; a job secret needs at least {MIN_SECRET} \
                 (e.g. `export {SECRET_VAR}=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')`)",
                secret.len()
            )));
        }
        Ok(JobAuth { secret, job_id })
    }

    /// The job's secret and id for `info`, from the environment (see the
    /// module documentation).
    pub fn from_env(info: &RankInfo) -> Result<JobAuth> {
        let (var, job_id) = match crate::env::var(JOB_ID_VAR)?.filter(|v| !v.is_empty()) {
            Some(id) => (JOB_ID_VAR, id),
            None => launcher_job_id(info).unwrap_or((JOB_ID_VAR, String::new())),
        };
        check_job_id(var, &job_id)?;
        match std::env::var_os(SECRET_VAR) {
            Some(v) => JobAuth::new(v.into_encoded_bytes(), job_id),
            None if matches!(info.launcher, "torchrun" | "mpirun" | "slurm")
                && info.world_size > 1 =>
            {
                Err(CommError::Usage(format!(
                    "{SECRET_VAR} is not set: a job of {} ranks started by {} authenticates its \
                     members with a secret every rank reads from its environment; set the same \
                     value (at least {MIN_SECRET} random bytes) for every rank, e.g. `export \
                     {SECRET_VAR}=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')` before \
                     launching (`polychip launch` sets one itself)",
                    info.world_size, info.launcher
                )))
            }
            None => JobAuth::new(user_secret()?, job_id),
        }
    }

    /// The HMAC-SHA256 tag of `parts` (each length-prefixed) under the secret.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        for p in parts {
            mac.update(&(p.len() as u64).to_le_bytes());
            mac.update(p);
        }
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `parts` (in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        for p in parts {
            mac.update(&(p.len() as u64).to_le_bytes());
            mac.update(p);
        }
        mac.verify_slice(tag).is_ok()
    }
}

/// The job id the launcher gave, if it gives one, and its variable.
fn launcher_job_id(info: &RankInfo) -> Option<(&'static str, String)> {
    let var = match info.launcher {
        "torchrun" => "TORCHELASTIC_RUN_ID",
        "slurm" => "SLURM_JOB_ID",
        "mpirun" => "OMPI_MCA_orte_hnp_uri",
        _ => return None,
    };
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty() && v != "none")
        .map(|v| (var, v))
}

/// Writes `bytes` to a new file at `path` that only this user can read
/// (mode 0600), refusing an existing file or a planted symlink there
/// (`O_EXCL`, `O_NOFOLLOW`).
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)
}

/// Where the user's own secret lives: `$XDG_RUNTIME_DIR/polychip`, else
/// `$HOME/.cache/polychip`, else a directory of the temporary directory
/// named for the user.
fn user_secret_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("polychip");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("polychip");
    }
    // SAFETY: geteuid has no preconditions.
    std::env::temp_dir().join(format!("polychip-{}", unsafe { libc::geteuid() }))
}

/// The user's own secret: created once (random, mode 0600, in a 0700
/// directory), then read; refused when the file is not a private regular
/// file of this user.
fn user_secret() -> Result<Vec<u8>> {
    user_secret_in(&user_secret_dir())
}

/// How many times [`user_secret_in`] tries to create the secret file when
/// it keeps disappearing between its creation and the read (another
/// process removing it): then it gives up with an error.
const CREATE_TRIES: usize = 5;

/// [`user_secret`] in the directory `dir`. The file is opened with
/// `O_NONBLOCK` (a FIFO planted there would block the open until a writer
/// came) and `O_NOFOLLOW` (a planted link is not followed), and anything
/// but a regular file is refused, naming the path and what it is.
fn user_secret_in(dir: &std::path::Path) -> Result<Vec<u8>> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    let io = |what: &str, e: std::io::Error| CommError::Io {
        rank: 0,
        op: "job secret".into(),
        message: format!("{what} {}: {e}", dir.display()),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("creating", e))?;
    let file = dir.join("job-secret");
    let refuse = |what: &str| {
        CommError::Usage(format!(
            "{} is {what}; it must be a regular file of this user readable by nobody else \
             (mode 0600): it is the secret that keeps other users out of this user's jobs. \
             Remove it (a new one is made), or set {SECRET_VAR}",
            file.display()
        ))
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for _ in 0..CREATE_TRIES {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&file)
        {
            Ok(mut f) => {
                let meta = f.metadata().map_err(|e| io("reading", e))?;
                if !meta.is_file() {
                    return Err(refuse(polychip_files::kind(meta.file_type())));
                }
                if meta.uid() != me {
                    return Err(refuse(&format!(
                        "owned by user {}, not this user",
                        meta.uid()
                    )));
                }
                let mode = meta.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(refuse(&format!(
                        "readable by others (mode {:04o})",
                        mode & 0o7777
                    )));
                }
                let mut secret = Vec::new();
                f.by_ref()
                    .take(4096)
                    .read_to_end(&mut secret)
                    .map_err(|e| io("reading", e))?;
                if secret.len() >= MIN_SECRET {
                    return Ok(secret);
                }
                return Err(CommError::Usage(format!(
                    "{} holds {} bytes, fewer than a secret needs ({MIN_SECRET}); remove it (a \
                     new one is made)",
                    file.display(),
                    secret.len()
                )));
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(refuse("a symbolic link"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let secret = hex(&random_bytes(32)?).into_bytes();
                let tmp = dir.join(format!("job-secret.{}", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                write_private(&tmp, &secret).map_err(|e| io("creating a secret in", e))?;
                // Another process may have made one meanwhile: the first
                // wins, and this one reads it.
                let linked = std::fs::hard_link(&tmp, &file);
                let _ = std::fs::remove_file(&tmp);
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(CommError::Io {
                            rank: 0,
                            op: "job secret".into(),
                            message: format!("creating {}: {e}", file.display()),
                        });
                    }
                }
            }
            Err(e) => return Err(io("reading the secret in", e)),
        }
    }
    Err(CommError::Io {
        rank: 0,
        op: "job secret".into(),
        message: format!(
            "{} disappeared each of the {CREATE_TRIES} times it was created (is another \
             process removing it?); set {SECRET_VAR} instead",
            file.display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_depend_on_the_secret_and_every_part() {
        let a = JobAuth::new("0123456789abcdef", "job").unwrap();
        let b = JobAuth::new("0123456789abcdeX", "job").unwrap();
        let t = a.tag(&[b"client", b"nonce", b"job"]);
        assert!(a.verify(&[b"client", b"nonce", b"job"], &t));
        assert!(!b.verify(&[b"client", b"nonce", b"job"], &t));
        assert!(!a.verify(&[b"client", b"nonce", b"jo", b"b"], &t));
        assert!(!a.verify(&[b"server", b"nonce", b"job"], &t));
        assert!(JobAuth::new("short", "job").is_err());
        assert!(!format!("{a:?}").contains("0123"), "Debug hides the secret");
    }

    /// A job id longer than the store's handshake carries is refused
    /// naming its variable and the limit (it failed the handshake on
    /// every rank, naming neither); the longest accepted still is.
    #[test]
    fn a_job_id_over_64_kib_is_refused_naming_the_variable() {
        let secret = "0123456789abcdef";
        let e = JobAuth::new(secret, "j".repeat(MAX_JOB_ID + 1))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "POLYCHIP_JOB_ID is 65537 bytes long; a job id has at most 65536 bytes (64 KiB)"
        );
        assert!(JobAuth::new(secret, "j".repeat(MAX_JOB_ID)).is_ok());
        let e = check_job_id("SLURM_JOB_ID", &"1".repeat(70_000)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("SLURM_JOB_ID is 70000 bytes long"),
            "{e}"
        );
    }

    #[test]
    fn the_users_secret_is_private_and_stable() {
        use std::os::unix::fs::PermissionsExt;
        let one = user_secret().unwrap();
        assert_eq!(user_secret().unwrap(), one);
        let file = user_secret_dir().join("job-secret");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("polychip-auth-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Runs `user_secret_in(dir)` on a thread; a hang fails the test.
    fn within_seconds(dir: PathBuf) -> Result<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(user_secret_in(&dir)));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("user_secret_in hung")
    }

    #[test]
    fn a_fifo_or_a_directory_at_the_secret_path_is_refused_not_waited_on() {
        let dir = scratch("fifo");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("job-secret");
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = within_seconds(dir.clone()).unwrap_err().to_string();
        assert!(
            e.contains(&file.display().to_string()) && e.contains("FIFO"),
            "{e}"
        );
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let e = within_seconds(dir.clone()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        std::fs::remove_dir(&file).unwrap();
        std::os::unix::fs::symlink("/dev/null", &file).unwrap();
        let e = within_seconds(dir.clone()).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        std::fs::remove_file(&file).unwrap();
        // And a fresh one is made and read back.
        let one = within_seconds(dir.clone()).unwrap();
        assert_eq!(within_seconds(dir.clone()).unwrap(), one);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
