//! Handles: what the C caller holds instead of pointers into libpolychip.
//!
//! A handle is an opaque pointer value that encodes a kind tag, a slot index
//! and the slot's generation; it is never dereferenced. Every call looks the
//! handle up in the registry of its kind, so a NULL handle, a freed one (its
//! slot's generation has moved on), a handle of another kind (a stream passed
//! as a tensor) or a value libpolychip never made is an error naming the
//! argument, not a crash. A lookup is one read lock and an index.

use std::sync::{Arc, RwLock};

use crate::error::{ApiError, ApiResult};

/// The kind tags, in the top byte of a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle(u8, &'static str);

impl Handle {
    pub(crate) const ERROR: Handle = Handle(0x51, "polychip_error_t");
    pub(crate) const RUNTIME: Handle = Handle(0x52, "polychip_runtime_t");
    pub(crate) const TENSOR: Handle = Handle(0x53, "polychip_tensor_t");
    pub(crate) const STREAM: Handle = Handle(0x54, "polychip_stream_t");
    pub(crate) const EVENT: Handle = Handle(0x55, "polychip_event_t");
    pub(crate) const COMM: Handle = Handle(0x56, "polychip_comm_t");

    const ALL: [Handle; 6] = [
        Handle::ERROR,
        Handle::RUNTIME,
        Handle::TENSOR,
        Handle::STREAM,
        Handle::EVENT,
        Handle::COMM,
    ];
}

/// The handle kind whose tag `value` carries, when it is one: a handle
/// passed where a pointer belongs (a `polychip_tensor_t *` given as a
/// `DLManagedTensorVersioned *`, say). No user-space address has these top
/// bytes.
pub(crate) fn kind_of(value: usize) -> Option<&'static str> {
    let tag = (value as u64 >> 56) as u8;
    Handle::ALL.iter().find(|k| k.0 == tag).map(|k| k.1)
}

struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

struct Slots<T> {
    entries: Vec<Slot<T>>,
    free: Vec<u32>,
}

/// The live objects of one handle kind.
pub(crate) struct Registry<T> {
    kind: Handle,
    slots: RwLock<Slots<T>>,
}

// Generations wrap at 24 bits; a slot reused 16 million times could make a
// very stale handle valid again, which is the detection's only gap.
const GENERATION_BITS: u32 = 24;

fn encode(kind: Handle, index: u32, generation: u32) -> *mut () {
    let value = (u64::from(kind.0) << 56)
        | (u64::from(generation & ((1 << GENERATION_BITS) - 1)) << 32)
        | (u64::from(index) + 1);
    std::ptr::without_provenance_mut(value as usize)
}

impl<T> Registry<T> {
    pub(crate) const fn new(kind: Handle) -> Registry<T> {
        Registry {
            kind,
            slots: RwLock::new(Slots {
                entries: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    /// Stores `value` and returns its handle.
    pub(crate) fn insert(&self, value: T) -> *mut () {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let value = Some(Arc::new(value));
        let index = match slots.free.pop() {
            Some(index) => {
                let slot = &mut slots.entries[index as usize];
                slot.value = value;
                index
            }
            None => {
                slots.entries.push(Slot {
                    generation: 0,
                    value,
                });
                (slots.entries.len() - 1) as u32
            }
        };
        encode(self.kind, index, slots.entries[index as usize].generation)
    }

    /// Why `handle` (the argument `name`) is not one of ours.
    fn refuse(&self, handle: *const (), name: &str) -> ApiError {
        let value = handle as usize as u64;
        let tag = (value >> 56) as u8;
        if handle.is_null() {
            return ApiError::invalid(format!("{name} is NULL"));
        }
        match Handle::ALL.iter().find(|k| k.0 == tag) {
            Some(other) if *other != self.kind => {
                ApiError::invalid(format!("{name} is a {}, not a {}", other.1, self.kind.1))
            }
            Some(_) => ApiError::invalid(format!(
                "{name} is not a live {} (it was destroyed)",
                self.kind.1
            )),
            None => ApiError::invalid(format!(
                "{name} is not a {} made by libpolychip ({handle:p})",
                self.kind.1
            )),
        }
    }

    /// The slot index of `handle` when it is a live handle of this registry.
    fn index(&self, slots: &Slots<T>, handle: *const ()) -> Option<usize> {
        let value = handle as usize as u64;
        if (value >> 56) as u8 != self.kind.0 {
            return None;
        }
        let index = (value & 0xffff_ffff).checked_sub(1)? as usize;
        let generation = ((value >> 32) & ((1 << GENERATION_BITS) - 1)) as u32;
        let slot = slots.entries.get(index)?;
        (slot.value.is_some() && slot.generation & ((1 << GENERATION_BITS) - 1) == generation)
            .then_some(index)
    }

    /// The object behind `handle` (the argument `name`).
    pub(crate) fn get(&self, handle: *const (), name: &str) -> ApiResult<Arc<T>> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        match self.index(&slots, handle) {
            Some(index) => Ok(slots.entries[index].value.clone().expect("live")),
            None => Err(self.refuse(handle, name)),
        }
    }

    /// Removes the object behind `handle`; the handle is dead from now on.
    pub(crate) fn remove(&self, handle: *const (), name: &str) -> ApiResult<Arc<T>> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let Some(index) = self.index(&slots, handle) else {
            return Err(self.refuse(handle, name));
        };
        let slot = &mut slots.entries[index];
        let value = slot.value.take().expect("live");
        slot.generation = slot.generation.wrapping_add(1);
        slots.free.push(index as u32);
        Ok(value)
    }

    /// How many objects are alive.
    pub(crate) fn live(&self) -> usize {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.entries.len() - slots.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked() {
        let r: Registry<u32> = Registry::new(Handle::TENSOR);
        let a = r.insert(7);
        assert_eq!(*r.get(a, "a").unwrap(), 7);
        assert_eq!(r.live(), 1);
        assert_eq!(*r.remove(a, "a").unwrap(), 7);
        let err = r.get(a, "a").unwrap_err();
        assert!(err.message.contains("destroyed"), "{}", err.message);
        let b = r.insert(8);
        assert_ne!(a, b, "a reused slot gets a new generation");
        assert!(r.get(a, "a").is_err());
        assert_eq!(*r.get(b, "b").unwrap(), 8);
        let stream = encode(Handle::STREAM, 0, 0);
        assert_eq!(
            r.get(stream, "t").unwrap_err().message,
            "t is a polychip_stream_t, not a polychip_tensor_t"
        );
        assert!(
            r.get(std::ptr::null(), "t")
                .unwrap_err()
                .message
                .contains("NULL")
        );
        let foreign = std::ptr::without_provenance::<()>(0x1234_5678);
        assert!(
            r.get(foreign, "t")
                .unwrap_err()
                .message
                .contains("made by libpolychip")
        );
        let err = r.remove(foreign, "t").unwrap_err();
        assert_eq!(err.code, crate::error::POLYCHIP_API_ERROR_INVALID_ARGUMENT);
    }
}
