//! Who this rank is, read from the environment every launcher already sets:
//! torchrun and `polychip launch` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), Open MPI's `mpirun`
//! (`OMPI_COMM_WORLD_*` plus `MASTER_ADDR`/`MASTER_PORT`) and Slurm's `srun`
//! (`SLURM_PROCID`, `SLURM_NTASKS`, ... with the rendezvous host taken from
//! the job's node list). They are tried in that order, so torchrun inside a
//! Slurm allocation is read as torchrun. A process with none of them set is
//! rank 0 of a world of 1.

use crate::error::{CommError, Result};
use crate::text::{quoted, shown};

/// The port Slurm jobs rendezvous on when `MASTER_PORT` is not set is this
/// plus the job id modulo 1000 (so two jobs sharing a node rarely collide).
pub const SLURM_BASE_PORT: u16 = 29500;

/// The most ranks a job may have. Larger values of `WORLD_SIZE` (and the
/// other launchers' counts) are refused by name before anything is sized
/// by them; the shared-memory and TCP communicators accept fewer still
/// (see [`crate::collectives::MAX_WORLD`]).
pub const MAX_WORLD_SIZE: usize = 1 << 16;

/// The variable that sets the communication deadline, in seconds.
pub const TIMEOUT_ENV: &str = "POLYCHIP_COMM_TIMEOUT_SECS";

/// The deadline when [`TIMEOUT_ENV`] is unset or empty: 60 s.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// The longest deadline [`TIMEOUT_ENV`] may set: one week.
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

/// Parses a [`TIMEOUT_ENV`] value: seconds, fractions allowed, more than 0
/// and at most [`MAX_TIMEOUT_SECS`]; `None` (unset) or empty gives the
/// default. Anything else (`abc`, `-1`, `0`, `inf`, `nan`) is an error that
/// names the variable and the value.
pub fn parse_timeout(value: Option<&str>) -> Result<std::time::Duration> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(std::time::Duration::from_secs(DEFAULT_TIMEOUT_SECS));
    };
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_SECS as f64 => {
            Ok(std::time::Duration::from_secs_f64(s))
        }
        _ => Err(CommError::Environment(format!(
            "{TIMEOUT_ENV} is {}, which is not a number of seconds greater than 0 and at \
             most {MAX_TIMEOUT_SECS} (one week)",
            quoted(v)
        ))),
    }
}

/// The deadline [`TIMEOUT_ENV`] sets in this process's environment (see
/// [`parse_timeout`]).
pub fn timeout_from_env() -> Result<std::time::Duration> {
    parse_timeout(var(TIMEOUT_ENV)?.as_deref())
}

/// The environment variable `name`'s value, `None` when unset. A value
/// that is not UTF-8 is an error naming the variable: it was taken as
/// unset until 2026-12-06 (`RANK=$'\xff' WORLD_SIZE=2` made a rank of a
/// launched job start a job of its own; a timeout or bind address that
/// was not UTF-8 was silently the default).
pub fn var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(raw)) => Err(CommError::Environment(format!(
            "{name} is {}, which is not UTF-8 text; set it to text or unset it",
            quoted(&raw.to_string_lossy())
        ))),
    }
}

/// `read` given a lookup of the process's variables through [`var`]: the
/// first that is not UTF-8 is the error, whatever `read` made of it.
pub fn with_env_vars<T>(
    read: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<T>,
) -> Result<T> {
    let bad = std::cell::RefCell::new(None);
    let get = |name: &str| match var(name) {
        Ok(v) => v,
        Err(e) => {
            bad.borrow_mut().get_or_insert(e);
            None
        }
    };
    let result = read(&get);
    match bad.into_inner() {
        Some(e) => Err(e),
        None => result,
    }
}

/// This process's place in the job, and where rank 0 serves the rendezvous
/// store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world_size: usize,
    /// This rank's index among the ranks on its machine.
    pub local_rank: usize,
    /// Number of ranks on this machine.
    pub local_world_size: usize,
    /// Host (name or address) where rank 0 serves the rendezvous store.
    pub master_addr: String,
    /// Port of the rendezvous store; 0 means "rank 0 picks a free one"
    /// (single-process jobs and tests).
    pub master_port: u16,
    /// Which launcher's variables were read: `"torchrun"`,
    /// `"polychip launch"`, `"mpirun"`, `"slurm"` or `"none"`.
    pub launcher: &'static str,
}

impl RankInfo {
    /// A job of one process: rank 0 of 1, rendezvous on 127.0.0.1 with a
    /// port picked when the store starts.
    pub fn single() -> RankInfo {
        RankInfo::local(0, 1, 0)
    }

    /// Rank `rank` of a job of `world` processes on this machine, with no
    /// launcher, rendezvous on `127.0.0.1:port` (0: picked when the store
    /// starts).
    pub fn local(rank: usize, world: usize, port: u16) -> RankInfo {
        RankInfo {
            rank,
            world_size: world,
            local_rank: rank,
            local_world_size: world,
            master_addr: "127.0.0.1".to_string(),
            master_port: port,
            launcher: "none",
        }
    }
}

/// Reads this process's [`RankInfo`] from its environment.
pub fn from_env() -> Result<RankInfo> {
    with_env_vars(|get| from_vars(get))
}

/// The variables by which [`from_vars`] recognises a launcher, in the order
/// it tries them (torchrun and `polychip launch`, Open MPI, Slurm).
pub const RANK_VARS: [&str; 3] = ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"];

/// Whether this process was started by a launcher (one of [`RANK_VARS`] is
/// set and not empty): a program that can start its own ranks then is one.
pub fn launched() -> bool {
    // A value that is not UTF-8 counts as set: reading it says it is not
    // text, rather than the process starting a job of its own.
    RANK_VARS
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.to_string_lossy().trim().is_empty()))
}

/// Reads a [`RankInfo`] from variables looked up through `get` (which
/// returns `None` for unset variables); [`from_env`] passes the process
/// environment. Empty values count as unset.
pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<RankInfo> {
    let vars = Vars { get: &get };
    if vars.has("RANK") {
        torchrun(&vars)
    } else if vars.has("OMPI_COMM_WORLD_RANK") {
        open_mpi(&vars)
    } else if vars.has("SLURM_PROCID") {
        slurm(&vars)
    } else if vars.has("WORLD_SIZE") {
        Err(CommError::Environment(format!(
            "WORLD_SIZE is {} but RANK is not set: a launcher that sets WORLD_SIZE must set RANK too",
            vars.raw("WORLD_SIZE")
        )))
    } else {
        let mut info = RankInfo::single();
        if let Some(addr) = vars.host("MASTER_ADDR")? {
            info.master_addr = addr;
        }
        if vars.has("MASTER_PORT") {
            info.master_port = vars.port("MASTER_PORT")?;
        }
        Ok(info)
    }
}

/// Variable lookup with parsing that names the variable in its errors.
struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.get)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The value for messages (see [`shown`]), or "unset".
    fn raw(&self, name: &str) -> String {
        self.get(name)
            .map_or_else(|| "unset".to_string(), |v| shown(&v))
    }

    /// A host variable's value, checked ([`check_host`]).
    fn host(&self, name: &str) -> Result<Option<String>> {
        let Some(host) = self.get(name) else {
            return Ok(None);
        };
        check_host(name, &host).map_err(CommError::Environment)?;
        Ok(Some(host))
    }

    fn number(&self, name: &str, launcher: &str) -> Result<usize> {
        let value = self.get(name).ok_or_else(|| {
            CommError::Environment(format!(
                "{launcher} variables are present but {name} is not set"
            ))
        })?;
        let n = value.parse::<usize>().map_err(|_| {
            CommError::Environment(format!(
                "{name} is {}, which is not a non-negative integer",
                quoted(&value)
            ))
        })?;
        if n > MAX_WORLD_SIZE {
            return Err(CommError::Environment(format!(
                "{name} is {n}, more than the {MAX_WORLD_SIZE} ranks a job may have"
            )));
        }
        Ok(n)
    }

    fn optional_number(&self, name: &str, launcher: &str) -> Result<Option<usize>> {
        if self.has(name) {
            self.number(name, launcher).map(Some)
        } else {
            Ok(None)
        }
    }

    fn port(&self, name: &str) -> Result<u16> {
        let value = self.get(name).unwrap_or_default();
        value.parse::<u16>().map_err(|_| {
            CommError::Environment(format!(
                "{name} is {}, which is not a TCP port (0 to 65535)",
                quoted(&value)
            ))
        })
    }
}

fn torchrun(vars: &Vars) -> Result<RankInfo> {
    let launcher = if vars.has("POLYCHIP_LAUNCHER") {
        "polychip launch"
    } else {
        "torchrun"
    };
    let rank = vars.number("RANK", launcher)?;
    if !vars.has("WORLD_SIZE") {
        return Err(CommError::Environment(format!(
            "RANK is {rank} but WORLD_SIZE is not set"
        )));
    }
    let world_size = vars.number("WORLD_SIZE", launcher)?;
    // Hand-written launch scripts often set only the four variables
    // PyTorch's env:// requires; then every rank is taken to be local.
    let local_rank = vars
        .optional_number("LOCAL_RANK", launcher)?
        .unwrap_or(rank);
    let local_world_size = vars
        .optional_number("LOCAL_WORLD_SIZE", launcher)?
        .unwrap_or(world_size);
    let (master_addr, master_port) = master(vars, world_size, launcher, None)?;
    check(
        RankInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
        },
        ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
    )
}

fn open_mpi(vars: &Vars) -> Result<RankInfo> {
    let launcher = "mpirun";
    let rank = vars.number("OMPI_COMM_WORLD_RANK", "Open MPI")?;
    let world_size = vars.number("OMPI_COMM_WORLD_SIZE", "Open MPI")?;
    let local_rank = vars.number("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI")?;
    let local_world_size = vars.number("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI")?;
    let hint = "Open MPI gives no address rank 0 could serve the rendezvous store on \
                (PMIX_SERVER_URI is its own daemon's, not usable): set MASTER_ADDR to rank 0's \
                host and MASTER_PORT to a free port, and pass them to every rank, \
                e.g. `mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500 ...`";
    let (master_addr, master_port) = master(vars, world_size, launcher, Some(hint))?;
    check(
        RankInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
        },
        [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ],
    )
}

fn slurm(vars: &Vars) -> Result<RankInfo> {
    let launcher = "slurm";
    let rank = vars.number("SLURM_PROCID", "Slurm")?;
    let world_size = if vars.has("SLURM_NTASKS") || !vars.has("SLURM_NPROCS") {
        vars.number("SLURM_NTASKS", "Slurm")?
    } else {
        vars.number("SLURM_NPROCS", "Slurm")?
    };
    let local_rank = vars.number("SLURM_LOCALID", "Slurm")?;
    let (local_world_size, local_name) = if vars.has("SLURM_NTASKS_PER_NODE") {
        (
            vars.number("SLURM_NTASKS_PER_NODE", "Slurm")?,
            "SLURM_NTASKS_PER_NODE",
        )
    } else if let Some(tasks) = vars.get("SLURM_TASKS_PER_NODE") {
        // Like "4(x2),3": the first number is this job's first node's count.
        let digits: String = tasks.chars().take_while(char::is_ascii_digit).collect();
        let n = digits.parse::<usize>().map_err(|_| {
            CommError::Environment(format!(
                "SLURM_TASKS_PER_NODE is {}, which does not start with a number of tasks",
                quoted(&tasks)
            ))
        })?;
        (n, "SLURM_TASKS_PER_NODE")
    } else {
        return Err(CommError::Environment(
            "Slurm variables are present but neither SLURM_NTASKS_PER_NODE nor \
             SLURM_TASKS_PER_NODE is set"
                .to_string(),
        ));
    };
    let master_addr = match vars.host("MASTER_ADDR")? {
        Some(addr) => addr,
        None => {
            let (name, list) = if let Some(list) = vars.get("SLURM_JOB_NODELIST") {
                ("SLURM_JOB_NODELIST", list)
            } else if let Some(list) = vars.get("SLURM_NODELIST") {
                ("SLURM_NODELIST", list)
            } else {
                return Err(CommError::Environment(
                    "Slurm variables are present but neither MASTER_ADDR nor \
                     SLURM_JOB_NODELIST is set, so rank 0's host is unknown"
                        .to_string(),
                ));
            };
            let host = first_host(&list).ok_or_else(|| {
                CommError::Environment(format!(
                    "{name} is {}, which does not start with a host name; \
                     set MASTER_ADDR to rank 0's host",
                    quoted(&list)
                ))
            })?;
            check_host(&format!("the first host of {name}"), &host)
                .map_err(CommError::Environment)?;
            host
        }
    };
    let master_port = if vars.has("MASTER_PORT") {
        vars.port("MASTER_PORT")?
    } else {
        let job = match vars.get("SLURM_JOB_ID").or_else(|| vars.get("SLURM_JOBID")) {
            Some(id) => id.parse::<u64>().map_err(|_| {
                CommError::Environment(format!(
                    "SLURM_JOB_ID is {}, which is not a job number; set MASTER_PORT",
                    quoted(&id)
                ))
            })?,
            None => 0,
        };
        SLURM_BASE_PORT + (job % 1000) as u16
    };
    check(
        RankInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
        },
        ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_name],
    )
}

/// `MASTER_ADDR`/`MASTER_PORT`: required for jobs of more than one rank,
/// 127.0.0.1 and "pick a port" for a job of one.
fn master(
    vars: &Vars,
    world_size: usize,
    launcher: &str,
    hint: Option<&str>,
) -> Result<(String, u16)> {
    let missing: Vec<&str> = ["MASTER_ADDR", "MASTER_PORT"]
        .into_iter()
        .filter(|name| !vars.has(name))
        .collect();
    if !missing.is_empty() && world_size > 1 {
        let what = missing.join(" and ");
        let verb = if missing.len() == 1 { "is" } else { "are" };
        let mut message = format!(
            "{launcher} started {world_size} ranks but {what} {verb} not set, so the ranks \
             cannot find rank 0's rendezvous store"
        );
        if let Some(hint) = hint {
            message.push_str(": ");
            message.push_str(hint);
        }
        return Err(CommError::Environment(message));
    }
    let addr = vars
        .host("MASTER_ADDR")?
        .unwrap_or_else(|| "127.0.0.1".to_string());
    let port = if vars.has("MASTER_PORT") {
        vars.port("MASTER_PORT")?
    } else {
        0
    };
    Ok((addr, port))
}

/// Checks the numbers agree; `names` are the variables the four numbers
/// came from (rank, world size, local rank, local world size).
fn check(info: RankInfo, names: [&str; 4]) -> Result<RankInfo> {
    let [rank, world, local_rank, local_world] = names;
    let fail = |m: String| Err(CommError::Environment(m));
    if info.world_size == 0 {
        return fail(format!("{world} is 0; a job has at least one rank"));
    }
    if info.rank >= info.world_size {
        return fail(format!(
            "{rank} is {} but {world} is {}",
            info.rank, info.world_size
        ));
    }
    if info.local_world_size == 0 {
        return fail(format!("{local_world} is 0; a node runs at least one rank"));
    }
    if info.local_rank >= info.local_world_size {
        return fail(format!(
            "{local_rank} is {} but {local_world} is {}",
            info.local_rank, info.local_world_size
        ));
    }
    if info.local_world_size > info.world_size {
        return fail(format!(
            "{local_world} is {} but {world} is {}",
            info.local_world_size, info.world_size
        ));
    }
    Ok(info)
}

/// The longest rendezvous host accepted, in bytes: a DNS name has at
/// most 253 characters, and an address (IPv6 with a zone) far fewer.
pub const MAX_HOST: usize = 255;

/// Refuses a rendezvous host that no socket call could take, before any
/// rank waits on it: longer than [`MAX_HOST`] bytes, or holding control
/// characters or spaces. The message names `what` (the variable or the
/// field the host came from) and quotes the value ([`quoted`]).
pub fn check_host(what: &str, host: &str) -> std::result::Result<(), String> {
    if host.len() > MAX_HOST {
        return Err(format!(
            "{what} is {}, longer than the {MAX_HOST} bytes of any host name or address",
            quoted(host)
        ));
    }
    if host.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "{what} is {}, which is not a host name or address (it holds control characters \
             or spaces)",
            quoted(host)
        ));
    }
    Ok(())
}

/// A host as the socket calls take it: an IPv6 address written in URL
/// brackets (`[::1]`, as `MASTER_ADDR` often is) without them; any other
/// host as it is.
pub fn bare_host(host: &str) -> &str {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) if inner.parse::<std::net::Ipv6Addr>().is_ok() => inner,
        _ => host,
    }
}

/// The first host of a Slurm node list: `node[01-04,07],gpu5` gives
/// `node01`, `a,b` gives `a`, `rack[1-2]-n[3-4]` gives `rack1-n3`.
pub fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                // Keep the first number (or name) of the range list.
                let mut first = String::new();
                let mut done = false;
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    if c == ',' || c == '-' {
                        done = true;
                    }
                    if !done {
                        first.push(c);
                    }
                }
                host.push_str(first.trim());
            }
            _ => host.push(c),
        }
    }
    let host = host.trim().to_string();
    (!host.is_empty()).then_some(host)
}
