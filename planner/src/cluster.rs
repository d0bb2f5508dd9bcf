//! Clusters of uneven chips: chip types (count, chips per node, memory, peak
//! FLOP/s per dtype, sustained efficiency, intra-node and NIC bandwidth) and
//! the network between nodes, read from TOML or seeded from
//! `polychip devices --json`. Bandwidths are bytes/s per direction, FLOP/s
//! are per chip; a node holds chips of one type only.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{SpecError, read_file};
pub use crate::framework::Framework;
use crate::settings::Dtype;

/// Sustained fraction of peak assumed for devices seeded from
/// `polychip devices --json`, which reports peaks only.
pub const DEFAULT_EFFICIENCY: f64 = 0.5;

/// NIC and inter-node bandwidth assumed for a seeded cluster, 25 GB/s
/// (a 200 Gb/s RoCE port); the JSON does not report the network.
pub const DEFAULT_NIC_BANDWIDTH: f64 = 25e9;

/// The least time one kernel takes by default, 50 µs: the host-side work
/// of an eager framework (PyTorch with Megatron's or DeepSpeed's hooks) to
/// launch one of the cost model's kernels, each of which stands for one to
/// three of a real layer's (its dropout, bias and cast kernels are not
/// modelled). While the kernels before it run longer, it is hidden; at
/// small micro-batches and high tensor parallelism it bounds the layer.
/// Our estimate, checked against Sailor's measured GH200 runs and layer
/// profiles (`planner/tests/outside_runs.rs`, whose
/// `the_default_dispatch_floor_is_near_the_best_of_a_sweep` prints the
/// sweep): 45-50 µs fit the runs best, 0-50 µs the single layers.
pub const DEFAULT_KERNEL_DISPATCH: f64 = 50e-6;

/// Machine balance assumed for a chip that gives no `memory_bandwidth`:
/// its largest peak FLOP/s over this many FLOPs per byte. Our estimate,
/// between A100 SXM (312 TFLOP/s bf16 over 2.0 TB/s, 156) and H100 SXM
/// (989 over 3.35 TB/s, 295), from the vendors' spec sheets.
pub const DEFAULT_FLOPS_PER_BYTE: f64 = 200.0;

/// The fixed part of the default memory reserve of a described chip: the
/// CUDA context, the communication library's buffers and the matmul
/// library's handles, 768 MiB. Our estimate: a CUDA context alone takes
/// about 300-500 MiB on current GPUs, NCCL's buffers some hundred more.
pub const DEFAULT_RESERVE_FIXED_BYTES: u64 = 768 << 20;

/// The proportional part of the default reserve: 5% of the capacity, for
/// the caching allocator's fragmentation (blocks cached but not usable for
/// a request of another size). Our estimate.
pub const DEFAULT_RESERVE_FRACTION: f64 = 0.05;

/// The default reserve is at most this fraction of the capacity (so a
/// small chip keeps room for the model).
pub const DEFAULT_RESERVE_CAP_FRACTION: f64 = 0.5;

/// Whether `f` is the default framework (left out of a written cluster).
fn is_megatron(f: &Framework) -> bool {
    *f == Framework::Megatron
}

/// The most chips of one type a cluster may hold (about a million: the
/// largest machines today have a few hundred thousand accelerators).
pub const MAX_CHIPS_PER_TYPE: u64 = 1 << 20;

/// The most chips per node.
pub const MAX_CHIPS_PER_NODE: u64 = 1024;

/// The most chip types a cluster may have.
pub const MAX_CHIP_TYPES: usize = 64;

/// The least peak FLOP/s per dtype a chip may have, 1 MFLOP/s: below it a
/// layer's time overflows the cost model (and no accelerator is that slow).
pub const MIN_FLOPS: f64 = 1e6;

/// The most peak FLOP/s per dtype, 1e20 (100 EFLOP/s): a thousand times
/// today's largest chip (a wafer-scale engine's 1.25e17).
pub const MAX_FLOPS: f64 = 1e20;

/// The least bandwidth (memory, intra-node, NIC, network) a cluster may
/// give, 1 MB/s, in bytes/s.
pub const MIN_BANDWIDTH: f64 = 1e6;

/// The most bandwidth, 1e18 bytes/s (1 EB/s): fifty times a wafer-scale
/// engine's on-chip 2.1e16.
pub const MAX_BANDWIDTH: f64 = 1e18;

/// The least memory per chip, 1 MiB.
pub const MIN_MEMORY_BYTES: u64 = 1 << 20;

/// The most memory per chip (and the most a profile may report), 1 PiB.
pub const MAX_MEMORY_BYTES: u64 = 1 << 50;

/// The least sustained fraction of peak, 1%: below it the chip is
/// described wrongly rather than slowly.
pub const MIN_EFFICIENCY: f64 = 0.01;

/// `v` for a message: as Rust prints it while that is short, else in
/// scientific notation (`1e-300`, not 300 digits).
pub fn fmt_num(v: f64) -> String {
    let plain = format!("{v}");
    if plain.len() <= 16 {
        plain
    } else {
        format!("{v:e}")
    }
}

/// Peak matmul FLOP/s of one chip per dtype.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakFlops {
    /// f32.
    pub f32: f64,
    /// bf16.
    pub bf16: f64,
    /// f16.
    pub f16: f64,
    /// fp8 (dense, Hopper-class and later): what the layers' matmuls run
    /// at under FP8 training (`TrainingSettings::fp8`); none where the
    /// chip has no FP8 matmuls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<f64>,
}

impl PeakFlops {
    /// The peak for `dtype`.
    pub fn get(&self, dtype: Dtype) -> f64 {
        match dtype {
            Dtype::F32 => self.f32,
            Dtype::Bf16 => self.bf16,
            Dtype::F16 => self.f16,
        }
    }
}

/// One kind of chip in the cluster and how many of it there are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChipType {
    /// Unique name, e.g. `"A100"`.
    pub name: String,
    /// Chips of this type in the cluster.
    pub count: u64,
    /// Chips per node; divides `count`.
    pub chips_per_node: u64,
    /// Memory per chip in bytes.
    pub memory_bytes: u64,
    /// Peak FLOP/s per dtype.
    pub peak_flops: PeakFlops,
    /// Sustained fraction of peak a transformer layer reaches, in (0, 1].
    pub efficiency: f64,
    /// Chip-to-chip bandwidth inside a node (NVLink and peers), bytes/s.
    pub intra_node_bandwidth: f64,
    /// Network bandwidth per chip out of its node, bytes/s: its share when
    /// every chip of the node sends at once (the node's network is
    /// `nic_bandwidth * chips_per_node` in all).
    pub nic_bandwidth: f64,
    /// The network interfaces a node has, which its chips share (a chip
    /// sends through one). Optional: `chips_per_node` by default, a NIC a
    /// chip, whose share is `nic_bandwidth` whoever else sends; 1 for a
    /// node whose chips share one NIC, which lends a stage of fewer chips
    /// than the node holds more each ([`ChipType::nic_share`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nics_per_node: Option<u64>,
    /// Memory bandwidth, bytes/s, for memory-bound work and the optimizer
    /// step; optional (then the largest peak over
    /// [`DEFAULT_FLOPS_PER_BYTE`], see [`ChipType::memory_bandwidth_or_default`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bandwidth: Option<f64>,
    /// Bytes of each chip's memory that training cannot use: the runtime's
    /// context, communication buffers, the allocator's fragmentation.
    /// Optional; see [`ChipType::memory_reserve`] for the default. Clusters
    /// seeded from `polychip devices --json` set 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reserve_bytes: Option<u64>,
    /// Scratch space the chip's matmul library takes per device, bytes.
    /// Optional: [`crate::cost::MATMUL_WORKSPACE_BYTES`] by default; 0 for
    /// clusters seeded from `polychip devices --json` (the stub plugins'
    /// matmuls allocate no device memory of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_workspace_bytes: Option<u64>,
    /// The least time one kernel takes, seconds: the framework's
    /// host-side dispatch. Optional: [`DEFAULT_KERNEL_DISPATCH`] by
    /// default; 0 for clusters seeded from `polychip devices --json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_dispatch_seconds: Option<f64>,
    /// The training framework this type's stages run under, whose tensors
    /// the memory model counts: `megatron` by default (Korthikanti et
    /// al.'s activations, as Megatron-LM, DeepSpeed and most PyTorch stacks
    /// keep them), `polychip` for `polychip train`'s own (the default of
    /// clusters seeded from `polychip devices --json`), see
    /// [`crate::framework`].
    #[serde(default, skip_serializing_if = "is_megatron")]
    pub framework: Framework,
    /// The devices of this type (`vendor:index`, as `polychip devices`
    /// names them), when the cluster was seeded from devices; a plan or a
    /// profile may name a stage's chip by one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Measured costs from a profile ([`ClusterSpec::apply_profile`]); not
    /// part of a cluster file.
    #[serde(skip)]
    pub measured: Vec<crate::profile::ProfileEntry>,
}

impl ChipType {
    /// Nodes of this type: `count / chips_per_node`.
    pub fn nodes(&self) -> u64 {
        self.count / self.chips_per_node.max(1)
    }

    /// Sustained FLOP/s of one chip for `dtype`: peak times efficiency.
    pub fn sustained_flops(&self, dtype: Dtype) -> f64 {
        self.peak_flops.get(dtype) * self.efficiency
    }

    /// The memory bandwidth, bytes/s: `memory_bandwidth` or, when the chip
    /// gives none, its largest peak FLOP/s over [`DEFAULT_FLOPS_PER_BYTE`].
    pub fn memory_bandwidth_or_default(&self) -> f64 {
        self.memory_bandwidth.unwrap_or_else(|| {
            let p = &self.peak_flops;
            p.f32.max(p.bf16).max(p.f16) / DEFAULT_FLOPS_PER_BYTE
        })
    }

    /// Bytes/s each of `k` chips of one node gets out of it when they send
    /// at once: the node's network (`nic_bandwidth` times
    /// `chips_per_node`) over `max(k, nics_per_node)`, each chip sending
    /// through one interface. With a NIC a chip (the default) that is
    /// `nic_bandwidth` for any `k`; with one NIC a node, a lone sender
    /// gets the node's whole network.
    pub fn nic_share(&self, k: u64) -> f64 {
        let per_node = self.chips_per_node.max(1);
        let nics = self.nics_per_node.unwrap_or(per_node).clamp(1, per_node);
        self.nic_bandwidth * per_node as f64 / k.clamp(1, per_node).max(nics) as f64
    }

    /// The least time one kernel takes, seconds: `kernel_dispatch_seconds`
    /// or [`DEFAULT_KERNEL_DISPATCH`].
    pub fn kernel_dispatch_or_default(&self) -> f64 {
        self.kernel_dispatch_seconds
            .unwrap_or(DEFAULT_KERNEL_DISPATCH)
    }

    /// Bytes of each chip's memory that training cannot use:
    /// `memory_reserve_bytes` or, by default,
    /// [`DEFAULT_RESERVE_FIXED_BYTES`] plus [`DEFAULT_RESERVE_FRACTION`] of
    /// the capacity, at most [`DEFAULT_RESERVE_CAP_FRACTION`] of it (80 GiB:
    /// 4.75 GiB; 32 GiB: 2.35 GiB).
    pub fn memory_reserve(&self) -> u64 {
        self.memory_reserve_bytes.unwrap_or_else(|| {
            let cap = self.memory_bytes as f64;
            let reserve = DEFAULT_RESERVE_FIXED_BYTES as f64 + DEFAULT_RESERVE_FRACTION * cap;
            reserve.min(DEFAULT_RESERVE_CAP_FRACTION * cap) as u64
        })
    }

    /// Scratch space of the chip's matmul library, bytes:
    /// `matmul_workspace_bytes` or [`crate::cost::MATMUL_WORKSPACE_BYTES`].
    pub fn matmul_workspace(&self) -> u64 {
        self.matmul_workspace_bytes
            .unwrap_or(crate::cost::MATMUL_WORKSPACE_BYTES as u64)
    }

    /// Bytes of each chip's memory left for training: `memory_bytes` less
    /// [`Self::memory_reserve`] and [`Self::matmul_workspace`].
    pub fn usable_memory(&self) -> u64 {
        self.memory_bytes
            .saturating_sub(self.memory_reserve())
            .saturating_sub(self.matmul_workspace())
    }

    /// Checks every field, naming it and its value on failure.
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |problem: String| SpecError::Chip {
            chip: self.name.clone(),
            problem,
        };
        if self.count == 0 {
            return Err(bad("count is 0; it must be at least 1".into()));
        }
        if self.chips_per_node == 0 {
            return Err(bad("chips_per_node is 0; it must be at least 1".into()));
        }
        if self.count > MAX_CHIPS_PER_TYPE {
            return Err(bad(format!(
                "count is {}, more than the planner accepts ({MAX_CHIPS_PER_TYPE})",
                self.count
            )));
        }
        if self.chips_per_node > MAX_CHIPS_PER_NODE {
            return Err(bad(format!(
                "chips_per_node is {}, more than the planner accepts ({MAX_CHIPS_PER_NODE})",
                self.chips_per_node
            )));
        }
        if self.count % self.chips_per_node != 0 {
            return Err(bad(format!(
                "chips_per_node {} does not divide count {}",
                self.chips_per_node, self.count
            )));
        }
        if !(MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(&self.memory_bytes) {
            return Err(bad(format!(
                "memory_bytes is {}; it must be from {MIN_MEMORY_BYTES} (1 MiB) to \
                 {MAX_MEMORY_BYTES} (1 PiB)",
                self.memory_bytes
            )));
        }
        let ranged = [
            (
                "peak_flops.f32",
                self.peak_flops.f32,
                MIN_FLOPS,
                MAX_FLOPS,
                "FLOP/s",
            ),
            (
                "peak_flops.bf16",
                self.peak_flops.bf16,
                MIN_FLOPS,
                MAX_FLOPS,
                "FLOP/s",
            ),
            (
                "peak_flops.f16",
                self.peak_flops.f16,
                MIN_FLOPS,
                MAX_FLOPS,
                "FLOP/s",
            ),
            (
                "intra_node_bandwidth",
                self.intra_node_bandwidth,
                MIN_BANDWIDTH,
                MAX_BANDWIDTH,
                "bytes/s",
            ),
            (
                "nic_bandwidth",
                self.nic_bandwidth,
                MIN_BANDWIDTH,
                MAX_BANDWIDTH,
                "bytes/s",
            ),
        ];
        let optional = self.memory_bandwidth.map(|b| {
            (
                "memory_bandwidth",
                b,
                MIN_BANDWIDTH,
                MAX_BANDWIDTH,
                "bytes/s",
            )
        });
        let fp8 = self
            .peak_flops
            .fp8
            .map(|f| ("peak_flops.fp8", f, MIN_FLOPS, MAX_FLOPS, "FLOP/s"));
        for (field, value, lo, hi, unit) in ranged.into_iter().chain(optional).chain(fp8) {
            if !(value.is_finite() && (lo..=hi).contains(&value)) {
                return Err(bad(format!(
                    "{field} is {}; it must be from {lo:e} to {hi:e} {unit}",
                    fmt_num(value)
                )));
            }
        }
        if let Some(n) = self.nics_per_node
            && !(1..=self.chips_per_node).contains(&n)
        {
            return Err(bad(format!(
                "nics_per_node {n} is not from 1 to chips_per_node ({})",
                self.chips_per_node
            )));
        }
        if let Some(d) = self.kernel_dispatch_seconds
            && !(d.is_finite() && (0.0..=1.0).contains(&d))
        {
            return Err(bad(format!(
                "kernel_dispatch_seconds {} is not in [0, 1] (seconds per kernel)",
                fmt_num(d)
            )));
        }
        if let Some(r) = self.memory_reserve_bytes
            && r >= self.memory_bytes
        {
            return Err(bad(format!(
                "memory_reserve_bytes {r} is not less than memory_bytes {}",
                self.memory_bytes
            )));
        }
        if let Some(w) = self.matmul_workspace_bytes
            && w >= self.memory_bytes
        {
            return Err(bad(format!(
                "matmul_workspace_bytes {w} is not less than memory_bytes {}",
                self.memory_bytes
            )));
        }
        let reserve = self.memory_reserve();
        let workspace = self.matmul_workspace();
        if reserve.saturating_add(workspace) >= self.memory_bytes {
            let given = |set: bool| if set { "" } else { ", the default" };
            return Err(bad(format!(
                "the memory reserve ({reserve} bytes{}) and the matmul workspace ({workspace} \
                 bytes{}) take all of memory_bytes {}, leaving nothing for training; lower \
                 memory_reserve_bytes or matmul_workspace_bytes",
                given(self.memory_reserve_bytes.is_some()),
                given(self.matmul_workspace_bytes.is_some()),
                self.memory_bytes
            )));
        }
        if !(self.efficiency.is_finite() && (MIN_EFFICIENCY..=1.0).contains(&self.efficiency)) {
            return Err(bad(format!(
                "efficiency {} is outside [{MIN_EFFICIENCY}, 1]; it is the sustained fraction \
                 of peak",
                fmt_num(self.efficiency)
            )));
        }
        Ok(())
    }
}

/// A cluster: its chip types and the network that joins their nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// The chip types, each with its own nodes.
    pub chip_types: Vec<ChipType>,
    /// Bandwidth of the network between nodes per chip-to-chip flow, bytes/s
    /// per direction; a cross-node transfer gets the least of this and both
    /// ends' NIC bandwidth.
    pub inter_node_bandwidth: f64,
}

impl ClusterSpec {
    /// Parses and validates a cluster from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let cluster: ClusterSpec = toml::from_str(text).map_err(|e| SpecError::Toml {
            what: "cluster",
            message: polychip_files::toml_error(text, &e),
        })?;
        cluster.validate()?;
        Ok(cluster)
    }

    /// Reads, parses and validates a cluster TOML file; an error in the
    /// file names it.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        Self::from_toml_str(&read_file(path)?).map_err(|e| SpecError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Checks every chip type, unique names, and the network.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.chip_types.is_empty() {
            return Err(SpecError::Cluster("it has no chip types".into()));
        }
        if self.chip_types.len() > MAX_CHIP_TYPES {
            return Err(SpecError::Cluster(format!(
                "it has {} chip types; the planner accepts at most {MAX_CHIP_TYPES}",
                self.chip_types.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for chip in &self.chip_types {
            if chip.name.trim().is_empty() {
                return Err(SpecError::Cluster("a chip type has an empty name".into()));
            }
            // A name is printed in tables and notes: a newline or escape
            // sequence in it broke their rows.
            if chip.name.chars().any(char::is_control) {
                return Err(SpecError::Cluster(format!(
                    "chip type name {} contains a control character (a newline, tab or \
                     escape); name it with printable characters",
                    polychip_files::printable(&format!("{:?}", chip.name))
                )));
            }
            if !seen.insert(chip.name.as_str()) {
                return Err(SpecError::Cluster(format!(
                    "chip type \"{}\" appears twice; names must be unique",
                    chip.name
                )));
            }
            chip.validate()?;
        }
        let bw = self.inter_node_bandwidth;
        if !(bw.is_finite() && (MIN_BANDWIDTH..=MAX_BANDWIDTH).contains(&bw)) {
            return Err(SpecError::Cluster(format!(
                "inter_node_bandwidth is {}; it must be from {MIN_BANDWIDTH:e} to \
                 {MAX_BANDWIDTH:e} bytes/s",
                fmt_num(bw)
            )));
        }
        Ok(())
    }

    /// All chips of all types.
    pub fn total_chips(&self) -> u64 {
        self.chip_types.iter().map(|c| c.count).sum()
    }

    /// The chip type called `name`.
    pub fn chip(&self, name: &str) -> Option<&ChipType> {
        self.chip_types.iter().find(|c| c.name == name)
    }

    /// Bandwidth between a chip of type `a` and one of type `b`: the
    /// intra-node link of `a` when they share a node (then `a` and `b` are
    /// the same type), otherwise the least of both NICs and the network,
    /// every chip of both nodes sending at once.
    pub fn link_bandwidth(&self, a: &ChipType, b: &ChipType, same_node: bool) -> f64 {
        self.send_bandwidth(a, u64::MAX, b, u64::MAX, same_node)
    }

    /// [`ClusterSpec::link_bandwidth`] for a pipeline send with `senders`
    /// chips of `a`'s node sending and `receivers` of `b`'s receiving at
    /// once: across nodes each end gets its [`ChipType::nic_share`].
    pub fn send_bandwidth(
        &self,
        a: &ChipType,
        senders: u64,
        b: &ChipType,
        receivers: u64,
        same_node: bool,
    ) -> f64 {
        if same_node {
            a.intra_node_bandwidth.min(b.intra_node_bandwidth)
        } else {
            a.nic_share(senders)
                .min(b.nic_share(receivers))
                .min(self.inter_node_bandwidth)
        }
    }

    /// Seeds a cluster from `polychip devices --json` output (the whole
    /// document, or just its `devices` array): one chip type per distinct
    /// device name, all on one node, with `memory_bytes` and
    /// `peak_flops.{f32,bf16,f16}` the least over that name's devices,
    /// `link_bandwidth` as the intra-node bandwidth (or
    /// [`DEFAULT_NIC_BANDWIDTH`] where it is 0), [`DEFAULT_NIC_BANDWIDTH`]
    /// for the NIC and the network, [`DEFAULT_EFFICIENCY`], and a memory
    /// reserve of 0 (the devices report what their allocator can hand out;
    /// the CPU stub plugins count only tensor bytes). Edit the result for a
    /// real multi-node cluster. The notes of
    /// [`Self::from_devices_json_with_notes`] are dropped.
    pub fn from_devices_json(json: &Value) -> Result<Self, SpecError> {
        Self::from_devices_json_with_notes(json).map(|(c, _)| c)
    }

    /// [`Self::from_devices_json`], with a note for each figure it assumed
    /// or chose: a bandwidth a device reports as 0 (unknown, as the OpenCL
    /// plugin reports both) takes its default, and devices of one name
    /// that differ in memory or peak FLOP/s make a type of the least (every
    /// device of a type must hold its stages). Refused, naming the device's
    /// index and the field: a device without a name, two devices of one
    /// id, a number that is missing, negative, not finite or (memory, peak
    /// FLOP/s) zero.
    pub fn from_devices_json_with_notes(json: &Value) -> Result<(Self, Vec<String>), SpecError> {
        let devices = match json.get("devices") {
            Some(d) => d,
            None => json,
        };
        let devices = devices.as_array().ok_or_else(|| {
            SpecError::DevicesJson("expected a \"devices\" array or an array of devices".into())
        })?;
        let mut types: BTreeMap<String, ChipType> = BTreeMap::new();
        let mut order = Vec::new();
        let mut notes = Vec::new();
        let mut ids: BTreeMap<String, usize> = BTreeMap::new();
        for (i, dev) in devices.iter().enumerate() {
            let name = dev
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| SpecError::DevicesJson(format!("device {i} has no \"name\"")))?;
            let bad = |m: String| SpecError::DevicesJson(format!("device {i} (\"{name}\") {m}"));
            // A number at `path`: present, finite, not negative, and
            // positive unless `zero_ok`.
            let num = |path: &[&str], zero_ok: bool| -> Result<f64, SpecError> {
                let mut v = dev;
                for key in path {
                    v = v.get(key).unwrap_or(&Value::Null);
                }
                let field = path.join(".");
                let x = v
                    .as_f64()
                    .ok_or_else(|| bad(format!("has no number at \"{field}\"")))?;
                if !x.is_finite() || x < 0.0 || (x == 0.0 && !zero_ok) {
                    return Err(bad(format!(
                        "has {field} {}; it must be a positive number",
                        fmt_num(x)
                    )));
                }
                Ok(x)
            };
            let memory = match dev.get("memory_bytes") {
                None | Some(Value::Null) => {
                    return Err(bad("has no \"memory_bytes\"".into()));
                }
                Some(v) => v.as_u64().filter(|&m| m > 0).ok_or_else(|| {
                    bad(format!(
                        "has memory_bytes {v}; it must be a positive whole number of bytes"
                    ))
                })?,
            };
            if !(MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(&memory) {
                return Err(bad(format!(
                    "has memory_bytes {memory}; the planner takes {MIN_MEMORY_BYTES} (1 MiB) to \
                     {MAX_MEMORY_BYTES} (1 PiB)"
                )));
            }
            let peak = PeakFlops {
                f32: num(&["peak_flops", "f32"], false)?,
                bf16: num(&["peak_flops", "bf16"], false)?,
                f16: num(&["peak_flops", "f16"], false)?,
                fp8: None,
            };
            let link = num(&["link_bandwidth"], true)?;
            let mem_bw = match dev.get("memory_bandwidth") {
                None | Some(Value::Null) => None,
                Some(_) => Some(num(&["memory_bandwidth"], true)?),
            };
            let id = dev
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_lowercase)
                .unwrap_or_else(|| format!("device{i}"));
            if let Some(first) = ids.insert(id.clone(), i) {
                return Err(SpecError::DevicesJson(format!(
                    "devices {first} and {i} both have id \"{id}\"; each device must be listed once"
                )));
            }
            if link == 0.0 {
                notes.push(format!(
                    "device {i} ({id}) reports link_bandwidth 0 (unknown); taken as {:e} bytes/s",
                    DEFAULT_NIC_BANDWIDTH
                ));
            }
            if mem_bw == Some(0.0) {
                notes.push(format!(
                    "device {i} ({id}) reports memory_bandwidth 0 (unknown); taken as its largest \
                     peak FLOP/s over {DEFAULT_FLOPS_PER_BYTE}"
                ));
            }
            match types.get_mut(name) {
                Some(t) => {
                    let differs = t.memory_bytes != memory || t.peak_flops != peak;
                    if differs {
                        let least = PeakFlops {
                            f32: t.peak_flops.f32.min(peak.f32),
                            bf16: t.peak_flops.bf16.min(peak.bf16),
                            f16: t.peak_flops.f16.min(peak.f16),
                            fp8: None,
                        };
                        notes.push(format!(
                            "device {i} ({id}) is a \"{name}\" like {} but has {memory} bytes of \
                             memory and peak FLOP/s {:e}/{:e}/{:e} (f32/bf16/f16) where they \
                             have {} and {:e}/{:e}/{:e}; the type takes the least, {} bytes and \
                             {:e}/{:e}/{:e}",
                            t.devices.join(", "),
                            peak.f32,
                            peak.bf16,
                            peak.f16,
                            t.memory_bytes,
                            t.peak_flops.f32,
                            t.peak_flops.bf16,
                            t.peak_flops.f16,
                            t.memory_bytes.min(memory),
                            least.f32,
                            least.bf16,
                            least.f16,
                        ));
                        t.memory_bytes = t.memory_bytes.min(memory);
                        t.peak_flops = least;
                    }
                    t.devices.push(id);
                    t.count += 1;
                    t.chips_per_node += 1;
                }
                None => {
                    order.push(name.to_string());
                    let link = if link > 0.0 {
                        link
                    } else {
                        DEFAULT_NIC_BANDWIDTH
                    };
                    types.insert(
                        name.to_string(),
                        ChipType {
                            name: name.to_string(),
                            count: 1,
                            chips_per_node: 1,
                            memory_bytes: memory,
                            peak_flops: peak,
                            efficiency: DEFAULT_EFFICIENCY,
                            intra_node_bandwidth: link,
                            nic_bandwidth: DEFAULT_NIC_BANDWIDTH,
                            nics_per_node: None,
                            memory_bandwidth: mem_bw.filter(|b| *b > 0.0),
                            // The stub plugins count only tensor bytes
                            // against memory_bytes: nothing is reserved.
                            memory_reserve_bytes: Some(0),
                            matmul_workspace_bytes: Some(0),
                            // The host calls a plugin's kernel directly
                            // (about a microsecond, in its measured rate).
                            kernel_dispatch_seconds: Some(0.0),
                            // Only polychip's trainer trains on them.
                            framework: Framework::Polychip,
                            devices: vec![id],
                            measured: Vec::new(),
                        },
                    );
                }
            }
        }
        let cluster = ClusterSpec {
            chip_types: order.iter().filter_map(|n| types.remove(n)).collect(),
            inter_node_bandwidth: DEFAULT_NIC_BANDWIDTH,
        };
        cluster.validate()?;
        Ok((cluster, notes))
    }
}

/// An example cluster of `examples/clusters/` by file name, for the
/// crate's tests.
#[cfg(test)]
pub(crate) fn example(name: &str) -> ClusterSpec {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/clusters/");
    ClusterSpec::load(format!("{dir}{name}").as_ref()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chip_name_with_a_control_character_is_refused() {
        let text = |name: &str| {
            format!(
                "inter_node_bandwidth = 25e9\n[[chip_types]]\nname = \"{name}\"\ncount = 8\n\
                 chips_per_node = 8\nmemory_bytes = 85899345920\n\
                 peak_flops = {{ f32 = 20e12, bf16 = 300e12, f16 = 300e12 }}\nefficiency = 0.5\n\
                 intra_node_bandwidth = 200e9\nnic_bandwidth = 25e9\n"
            )
        };
        assert!(ClusterSpec::from_toml_str(&text("a-1")).is_ok());
        let e = ClusterSpec::from_toml_str(&text("a\\u001b[31m\\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("contains a control character"), "{e}");
        assert!(!e.contains('\u{1b}') && !e.contains('\n'), "{e}");
    }

    const A100: &str = r#"
inter_node_bandwidth = 25e9
[[chip_types]]
name = "A100"
count = 24
chips_per_node = 8
memory_bytes = 85899345920
peak_flops = { f32 = 19.5e12, bf16 = 312e12, f16 = 312e12 }
efficiency = 0.5
intra_node_bandwidth = 300e9
nic_bandwidth = 25e9
"#;

    #[test]
    fn parses_and_reports_field_errors() {
        let c = ClusterSpec::from_toml_str(A100).unwrap();
        assert_eq!(c.total_chips(), 24);
        assert_eq!(c.chip_types[0].framework, Framework::Megatron);
        let with = |line: &str| {
            A100.replace(
                "nic_bandwidth = 25e9\n",
                &format!("nic_bandwidth = 25e9\n{line}\n"),
            )
        };
        let p = ClusterSpec::from_toml_str(&with("framework = \"polychip\"")).unwrap();
        assert_eq!(p.chip_types[0].framework, Framework::Polychip);
        // Written back only when it is not the default.
        assert!(
            toml::to_string(&p)
                .unwrap()
                .contains("framework = \"polychip\"")
        );
        assert!(!toml::to_string(&c).unwrap().contains("framework"));
        let err = ClusterSpec::from_toml_str(&with("framework = \"jax\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown variant `jax`") && err.contains("megatron"),
            "{err}"
        );
        assert_eq!(c.chip("A100").unwrap().nodes(), 3);
        let err = ClusterSpec::from_toml_str(&A100.replace("= 8\n", "= 16\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "chip type \"A100\": chips_per_node 16 does not divide count 24"
        );
        let err = ClusterSpec::from_toml_str(&A100.replace("0.5", "1.5"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("chip type \"A100\": efficiency 1.5 is outside"),
            "{err}"
        );
        let err = ClusterSpec::from_toml_str(
            &A100.replace("nic_bandwidth = 25e9", "nic_bandwidth = 0.0"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("nic_bandwidth is 0; it must be from 1e6 to 1e18 bytes/s"),
            "{err}"
        );
        for bad in ["-1e-6", "nan", "2.0"] {
            let err = ClusterSpec::from_toml_str(&A100.replace(
                "nic_bandwidth = 25e9",
                &format!("nic_bandwidth = 25e9\nkernel_dispatch_seconds = {bad}"),
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("kernel_dispatch_seconds"), "{err}");
        }
        let err = ClusterSpec::from_toml_str(&A100.replace("efficiency", "eff"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("could not parse cluster TOML"), "{err}");
        let err =
            ClusterSpec::from_toml_str(&A100.replace("count = 24", "count = 9223372036854775800"))
                .unwrap_err()
                .to_string();
        assert_eq!(
            err,
            "chip type \"A100\": count is 9223372036854775800, more than the planner accepts (1048576)"
        );
        let mut many = ClusterSpec::from_toml_str(A100).unwrap();
        let one = many.chip_types[0].clone();
        many.chip_types = (0..65)
            .map(|i| ChipType {
                name: format!("t{i}"),
                ..one.clone()
            })
            .collect();
        let err = many.validate().unwrap_err().to_string();
        assert!(err.contains("65 chip types"), "{err}");
    }

    #[test]
    fn absurd_figures_are_refused_naming_the_field() {
        let with = |line: &str| format!("{A100}{line}\n");
        for (line, want) in [
            (
                "memory_bandwidth = 1e-300",
                "chip type \"A100\": memory_bandwidth is 1e-300; it must be from 1e6 to 1e18 bytes/s",
            ),
            (
                "matmul_workspace_bytes = 18446744073709551615",
                "matmul_workspace_bytes 18446744073709551615 is not less than memory_bytes",
            ),
            (
                "memory_reserve_bytes = 85899345919",
                "the memory reserve (85899345919 bytes) and the matmul workspace (33554432 bytes, \
                 the default) take all of memory_bytes 85899345920",
            ),
        ] {
            let err = ClusterSpec::from_toml_str(&with(line))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{line}: {err}");
        }
        for (from, to, want) in [
            (
                "f32 = 19.5e12",
                "f32 = 1e-300",
                "peak_flops.f32 is 1e-300; it must be from 1e6 to 1e20 FLOP/s",
            ),
            (
                "bf16 = 312e12",
                "bf16 = 1e300",
                "peak_flops.bf16 is 1e300; it must be from 1e6 to 1e20 FLOP/s",
            ),
            (
                "efficiency = 0.5",
                "efficiency = 1e-300",
                "efficiency 1e-300 is outside [0.01, 1]",
            ),
            (
                "memory_bytes = 85899345920",
                "memory_bytes = 1",
                "memory_bytes is 1; it must be",
            ),
            (
                "inter_node_bandwidth = 25e9",
                "inter_node_bandwidth = 1e300",
                "cluster: inter_node_bandwidth is 1e300; it must be from 1e6 to 1e18 bytes/s",
            ),
        ] {
            let err = ClusterSpec::from_toml_str(&A100.replace(from, to))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{to}: {err}");
        }
        // A file's errors name it.
        let path = std::env::temp_dir().join(format!("cluster-{}.toml", std::process::id()));
        std::fs::write(&path, with("memory_bandwidth = 0.0")).unwrap();
        let err = ClusterSpec::load(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(
            err.starts_with(&format!(
                "{}: chip type \"A100\": memory_bandwidth is 0",
                path.display()
            )),
            "{err}"
        );
    }

    #[test]
    fn devices_json_refuses_duplicates_and_bad_numbers_by_index() {
        let dev = |id: &str, mem: serde_json::Value, link: f64, mem_bw: f64| {
            serde_json::json!({
                "id": id, "name": "ferrite", "memory_bytes": mem,
                "peak_flops": { "f32": 1e12, "bf16": 4e12, "f16": 4e12 },
                "memory_bandwidth": mem_bw, "link_bandwidth": link,
            })
        };
        let gib = serde_json::json!(8u64 << 30);
        let err = |devs: Vec<serde_json::Value>| {
            ClusterSpec::from_devices_json(&serde_json::json!({ "devices": devs }))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(vec![
                dev("F:0", gib.clone(), 1e10, 1e11),
                dev("f:0", gib.clone(), 1e10, 1e11)
            ]),
            "devices JSON: devices 0 and 1 both have id \"f:0\"; each device must be listed once"
        );
        assert_eq!(
            err(vec![dev("f:0", serde_json::json!(-1), 1e10, 1e11)]),
            "devices JSON: device 0 (\"ferrite\") has memory_bytes -1; it must be a positive whole \
             number of bytes"
        );
        let e = err(vec![
            dev("f:0", gib.clone(), 1e10, 1e11),
            dev("f:1", gib.clone(), -1.0, 1e11),
        ]);
        assert!(
            e.contains("device 1 (\"ferrite\") has link_bandwidth -1"),
            "{e}"
        );
        let e = err(vec![dev("f:0", gib.clone(), 1e10, -5.0)]);
        assert!(
            e.contains("device 0 (\"ferrite\") has memory_bandwidth -5"),
            "{e}"
        );
        // 0 is the ABI's "unknown": the default, with a note.
        let (c, notes) = ClusterSpec::from_devices_json_with_notes(&serde_json::json!([dev(
            "f:0",
            gib.clone(),
            0.0,
            0.0
        )]))
        .unwrap();
        assert_eq!(c.chip_types[0].intra_node_bandwidth, DEFAULT_NIC_BANDWIDTH);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].contains("device 0 (f:0) reports link_bandwidth 0"),
            "{notes:?}"
        );
        assert!(notes[1].contains("memory_bandwidth 0"), "{notes:?}");
        // One name, different memory: the least, said in a note.
        let (c, notes) = ClusterSpec::from_devices_json_with_notes(&serde_json::json!([
            dev("f:0", gib.clone(), 1e10, 1e11),
            dev("f:1", serde_json::json!(4u64 << 30), 1e10, 1e11),
        ]))
        .unwrap();
        assert_eq!(c.chip_types[0].memory_bytes, 4 << 30);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("device 1 (f:1)")
                && notes[0].contains("the type takes the least, 4294967296 bytes"),
            "{notes:?}"
        );
        // ... and a device too small to plan on is refused.
        let e = err(vec![
            dev("f:0", gib, 1e10, 1e11),
            dev("f:1", serde_json::json!(1), 1e10, 1e11),
        ]);
        assert!(
            e.contains("device 1 (\"ferrite\") has memory_bytes 1; the planner takes 1048576"),
            "{e}"
        );
    }

    #[test]
    fn reserve_and_bandwidth_defaults() {
        let c = ClusterSpec::from_toml_str(A100).unwrap();
        let a = c.chip("A100").unwrap();
        // 768 MiB + 5% of 80 GiB = 4.75 GiB.
        assert_eq!(a.memory_reserve(), (768 << 20) + (4096 << 20));
        // No memory_bandwidth: the bf16 peak over 200 FLOP/byte.
        assert_eq!(a.memory_bandwidth_or_default(), 312e12 / 200.0);
        let mut small = a.clone();
        small.memory_bytes = 1 << 30;
        assert_eq!(small.memory_reserve(), 1 << 29); // capped at half
        let set =
            ClusterSpec::from_toml_str(&format!("{A100}memory_reserve_bytes = 1024\n")).unwrap();
        assert_eq!(set.chip_types[0].memory_reserve(), 1024);
        let text = toml::to_string(&c).unwrap();
        assert!(!text.contains("memory_reserve_bytes"), "{text}");
        let err =
            ClusterSpec::from_toml_str(&format!("{A100}memory_reserve_bytes = 85899345920\n"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("memory_reserve_bytes 85899345920 is not less"),
            "{err}"
        );
    }

    #[test]
    fn link_bandwidth_takes_the_slowest_hop() {
        let c = ClusterSpec::from_toml_str(A100).unwrap();
        let a = c.chip("A100").unwrap();
        let mut b = a.clone();
        b.nic_bandwidth = 12.5e9;
        assert_eq!(c.link_bandwidth(a, a, true), 300e9);
        assert_eq!(c.link_bandwidth(a, &b, false), 12.5e9);
        assert_eq!(c.link_bandwidth(a, a, false), 25e9);
        // One NIC for the node's 8 chips: 2 chips sending share the
        // node's 200 GB/s, the network's 25 GB/s a flow bounds them.
        let mut one = a.clone();
        one.nics_per_node = Some(1);
        assert_eq!(one.nic_share(2), 100e9);
        assert_eq!(one.nic_share(8), 25e9);
        assert_eq!(one.nic_share(0), 200e9);
        assert_eq!(a.nic_share(2), 25e9);
        assert_eq!(c.send_bandwidth(&one, 2, &one, 2, false), 25e9);
        let mut wide = c.clone();
        wide.inter_node_bandwidth = 400e9;
        assert_eq!(wide.send_bandwidth(&one, 2, &one, 4, false), 50e9);
        assert_eq!(wide.send_bandwidth(&one, 2, a, 2, false), 25e9);
        let err = ClusterSpec::from_toml_str(&A100.replace(
            "nic_bandwidth = 25e9",
            "nic_bandwidth = 25e9\nnics_per_node = 9",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("nics_per_node 9 is not from 1 to chips_per_node (8)"),
            "{err}"
        );
    }

    #[test]
    fn seeds_from_devices_json() {
        let dev = |name: &str, mem: u64| {
            serde_json::json!({
                "id": format!("{name}:{mem}"), "name": name, "memory_bytes": mem,
                "peak_flops": { "f32": 1e12, "bf16": 4e12, "f16": 4e12 },
                "memory_bandwidth": 1e11, "link_bandwidth": 0.0,
            })
        };
        let doc = serde_json::json!({
            "devices": [dev("ferrite", 8 << 30), dev("cobalt", 4 << 30), dev("ferrite", 6 << 30)],
            "failures": [],
        });
        let c = ClusterSpec::from_devices_json(&doc).unwrap();
        assert_eq!(c.chip_types.len(), 2);
        let f = &c.chip_types[0];
        assert_eq!(
            (f.name.as_str(), f.count, f.chips_per_node),
            ("ferrite", 2, 2)
        );
        assert_eq!(f.memory_bytes, 6 << 30);
        assert_eq!(f.intra_node_bandwidth, DEFAULT_NIC_BANDWIDTH);
        assert_eq!(c.chip_types[1].count, 1);
        // Seeded devices reserve nothing; a described chip does by default.
        assert!(c.chip_types.iter().all(|t| t.memory_reserve() == 0));
        assert!(
            c.chip_types
                .iter()
                .all(|t| t.framework == Framework::Polychip)
        );
        assert_eq!(f.memory_bandwidth_or_default(), 1e11);
        let err = ClusterSpec::from_devices_json(&serde_json::json!([{"name": "x"}]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "devices JSON: device 0 (\"x\") has no \"memory_bytes\""
        );
    }
}
