//! The RDMA verbs transport (InfiniBand / RoCE), behind the `verbs` cargo
//! feature: `VerbsTransport` implements the one-sided
//! [`Transport`](crate::transport::Transport) with one reliable-connected
//! queue pair per pair of ranks, RDMA WRITEs from registered staging memory
//! and RDMA WRITE WITH IMMEDIATE for signals. [`rdma_availability`] is always
//! compiled and says whether RDMA can be used here, so the layer can pick
//! another transport. The store records and the pure choices ([`wire`],
//! [`options`]) need no hardware and are tested without the feature, as is
//! the store-borne channel of its failure and departure notices
//! ([`notices`]).

pub mod notices;
pub mod options;
pub mod probe;
pub mod wire;

#[cfg(feature = "verbs")]
mod connect;
#[cfg(feature = "verbs")]
mod state;
#[cfg(feature = "verbs")]
mod sys;
#[cfg(feature = "verbs")]
mod transport;

pub use options::VerbsOptions;
pub use probe::{RdmaAvailability, rdma_availability};
#[cfg(feature = "verbs")]
pub use state::MAX_SIGNALS;
#[cfg(feature = "verbs")]
pub use transport::VerbsTransport;
