//! The staging pool of the CPU-mediated path: page-aligned host buffers,
//! allocated once and pre-faulted (every page written) so that no call pays
//! for page faults or allocation. A buffer grows only when a larger request
//! than it ever served arrives; [`StagingPool::allocations`] counts every
//! allocation so tests can check that repeated calls allocate nothing.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::NonNull;

/// Alignment (and rounding) of every staging buffer.
const PAGE: usize = 4096;

/// One page-aligned, initialised host buffer.
struct HostBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: HostBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for HostBuf {}
// SAFETY: shared access only hands out `&[u8]`, like a Box<[u8]>.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    const EMPTY: HostBuf = HostBuf {
        ptr: NonNull::dangling(),
        len: 0,
    };

    /// A zeroed buffer of at least `len` bytes (a whole number of pages);
    /// writing the zeros faults every page in now.
    fn new(len: usize) -> HostBuf {
        let len = len.next_multiple_of(PAGE);
        let layout = Layout::from_size_align(len, PAGE).expect("staging size fits a layout");
        // SAFETY: `layout` has a non-zero size (callers never ask for 0 bytes).
        let ptr = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is a fresh allocation of `len` writable bytes.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        HostBuf { ptr, len }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` addresses `len` initialised bytes owned by `self`
        // (or is dangling with `len == 0`), borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            let layout = Layout::from_size_align(self.len, PAGE).expect("as allocated");
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Pooled, pre-faulted, page-aligned host buffers for staging device memory.
pub struct StagingPool {
    bufs: Vec<HostBuf>,
    allocations: u64,
}

impl std::fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StagingPool {{ {} buffers, {} bytes, {} allocations }}",
            self.bufs.len(),
            self.bytes(),
            self.allocations
        )
    }
}

impl Default for StagingPool {
    fn default() -> StagingPool {
        StagingPool::new()
    }
}

impl StagingPool {
    /// An empty pool: buffers appear on first use.
    pub fn new() -> StagingPool {
        StagingPool {
            bufs: Vec::new(),
            allocations: 0,
        }
    }

    /// How many host buffers it has allocated since it was made.
    pub fn allocations(&self) -> u64 {
        self.allocations
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.len).sum()
    }

    /// Buffer `i` holds at least `sizes[i]` bytes afterwards; one that is
    /// too small is replaced (the only allocation). Returns disjoint slices
    /// of exactly `sizes[i]` bytes (a size of 0 allocates nothing).
    pub(crate) fn take(&mut self, sizes: &[usize]) -> Vec<&mut [u8]> {
        if self.bufs.len() < sizes.len() {
            self.bufs.resize_with(sizes.len(), || HostBuf::EMPTY);
        }
        for (buf, &size) in self.bufs.iter_mut().zip(sizes) {
            if buf.len < size {
                *buf = HostBuf::new(size);
                self.allocations += 1;
            }
        }
        self.bufs
            .iter_mut()
            .zip(sizes)
            .map(|(buf, &size)| &mut buf.as_mut_slice()[..size])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::StagingPool;

    #[test]
    fn grows_only_for_larger_requests() {
        let mut pool = StagingPool::new();
        let bufs = pool.take(&[10, 0, 5000]);
        assert_eq!(
            bufs.iter().map(|b| b.len()).collect::<Vec<_>>(),
            [10, 0, 5000]
        );
        assert_eq!(bufs[2].as_ptr() as usize % 4096, 0);
        assert_eq!(pool.allocations(), 2);
        pool.take(&[4096, 0, 8192]);
        assert_eq!(pool.allocations(), 2, "sizes round up to whole pages");
        pool.take(&[4096, 0, 8193]);
        assert_eq!(pool.allocations(), 3, "only the third buffer grew");
        pool.take(&[1, 0, 2]);
        assert_eq!(pool.allocations(), 3);
        assert_eq!(pool.bytes(), 4096 + 12288);
    }
}
