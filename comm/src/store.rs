//! The key-value store ranks use to find each other: every launcher gives
//! the ranks an address (`MASTER_ADDR:MASTER_PORT`) where rank 0 serves one.
//! [`Store`] is the interface; [`MemoryStore`] serves threads of one process
//! (tests), the TCP store serves processes.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// A rendezvous key-value store shared by every rank of a job.
pub trait Store: Send + Sync {
    /// Sets `key` to `value` (overwriting).
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits until `key` exists (at most `timeout`) and returns its value.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer stored at `key` (0 when absent) and
    /// returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
}

/// A store inside one process, for ranks that are threads.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: 0,
                    op: "store get".into(),
                    after: timeout,
                    waiting_for: format!("key {key:?}"),
                });
            }
            map = self
                .changed
                .wait_timeout(map, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let old = map
            .get(key)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
            .unwrap_or(0);
        let new = old + delta;
        map.insert(key.to_string(), new.to_string().into_bytes());
        drop(map);
        self.changed.notify_all();
        Ok(new)
    }
}
