//! Whether RDMA verbs can be used here at all, asked without building a
//! transport: the layer calls [`rdma_availability`] to decide whether to try
//! the verbs transport or pick another. "Unavailable" is an answer, not an
//! error: it carries the reason (no kernel support, no devices, or a build
//! without the `verbs` feature).

/// Whether this process can use RDMA verbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaAvailability {
    /// At least one RDMA device is present.
    Available {
        /// The devices' names (e.g. `mlx5_0`), in `ibv_get_device_list` order.
        devices: Vec<String>,
    },
    /// RDMA cannot be used; `reason` says why, starting "RDMA unavailable".
    Unavailable {
        /// Why, in words.
        reason: String,
    },
}

impl RdmaAvailability {
    /// Whether RDMA is available.
    pub fn is_available(&self) -> bool {
        matches!(self, RdmaAvailability::Available { .. })
    }
}

/// Lists the RDMA devices, or says why there are none.
pub fn rdma_availability() -> RdmaAvailability {
    imp::availability()
}

/// The reason given when `ibv_get_device_list` fails with OS error `errno`.
pub fn device_list_failure(err: &std::io::Error) -> String {
    let hint = match err.raw_os_error() {
        Some(libc::ENOSYS) => " (ENOSYS); the kernel has no InfiniBand/RoCE support",
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "; no permission to open the RDMA devices (/dev/infiniband)"
        }
        _ => "",
    };
    format!("RDMA unavailable: ibv_get_device_list failed: {err}{hint}")
}

#[cfg(feature = "verbs")]
mod imp {
    use super::{RdmaAvailability, device_list_failure};

    pub fn availability() -> RdmaAvailability {
        match ibverbs::devices() {
            Err(e) => RdmaAvailability::Unavailable {
                reason: device_list_failure(&e),
            },
            Ok(list) if list.is_empty() => RdmaAvailability::Unavailable {
                reason: "RDMA unavailable: no RDMA devices found".into(),
            },
            Ok(list) => RdmaAvailability::Available {
                devices: list
                    .iter()
                    .map(|d| {
                        d.name()
                            .map_or_else(|| "?".into(), |n| n.to_string_lossy().into_owned())
                    })
                    .collect(),
            },
        }
    }
}

#[cfg(not(feature = "verbs"))]
mod imp {
    use super::RdmaAvailability;

    pub fn availability() -> RdmaAvailability {
        RdmaAvailability::Unavailable {
            reason: "RDMA unavailable: polychip-comm was built without the `verbs` feature".into(),
        }
    }
}
