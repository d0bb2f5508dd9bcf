//! polychip's shared communication layer (the DiComm part): ranks find each
//! other through the launcher's environment and a key-value [`store`];
//! collectives are written once over a one-sided [`transport`] interface
//! shaped like RDMA (registered regions, remote writes, signals), with
//! shared-memory, TCP and RDMA-verbs transports underneath.
//!
//! Work in progress: see the module list for what exists.

pub mod error;
pub mod store;
pub mod transport;

pub use error::{CommError, Result};
