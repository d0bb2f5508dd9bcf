//! polychip's shared communication layer (the DiComm part): ranks find each
//! other through the launcher's environment and a key-value [`store`];
//! collectives are written once over a one-sided [`transport`] interface
//! shaped like RDMA (registered regions, remote writes, signals), with
//! shared-memory, TCP and RDMA-verbs transports underneath.
//!
//! Work in progress: see the module list for what exists.

pub mod auth;
pub mod bench;
pub mod bootstrap;
pub mod collectives;
pub mod device;
pub mod env;
pub mod error;
pub mod launch;
pub mod shm;
pub mod split;
pub mod store;
pub mod tcp;
pub mod tcp_store;
pub mod text;
pub mod transport;
pub mod verbs;

pub use error::{CommError, Result};
