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

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.next_multiple_of(PAGE), PAGE)
            .expect("staging size fits a layout")
    }

    /// A zeroed buffer of at least `len` bytes (a whole number of pages),
    /// or `None` when the memory cannot be had; writing the zeros faults
    /// every page in now.
    fn try_new(len: usize) -> Option<HostBuf> {
        if len > isize::MAX as usize - PAGE {
            return None;
        }
        let layout = Self::layout(len);
        let len = layout.size();
        // SAFETY: `layout` has a non-zero size (callers never ask for 0 bytes).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        // SAFETY: `ptr` is a fresh allocation of `len` writable bytes.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        Some(HostBuf { ptr, len })
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
        match self.try_take(sizes) {
            Ok(slices) => slices,
            Err(bytes) => handle_alloc_error(HostBuf::layout(bytes)),
        }
    }

    /// [`StagingPool::take`], or `Err(bytes)` when a buffer of that many
    /// bytes cannot be had (for sizes that follow from the caller's
    /// tensors: a group stages each whole), rather than ending the process.
    pub(crate) fn try_take(&mut self, sizes: &[usize]) -> Result<Vec<&mut [u8]>, usize> {
        if self.bufs.len() < sizes.len() {
            self.bufs.resize_with(sizes.len(), || HostBuf::EMPTY);
        }
        for (buf, &size) in self.bufs.iter_mut().zip(sizes) {
            if buf.len < size {
                // The old buffer first, so that both are not held at once.
                *buf = HostBuf::EMPTY;
                *buf = HostBuf::try_new(size).ok_or(size)?;
                self.allocations += 1;
            }
        }
        Ok(self
            .bufs
            .iter_mut()
            .zip(sizes)
            .map(|(buf, &size)| &mut buf.as_mut_slice()[..size])
            .collect())
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

    #[test]
    fn a_size_that_cannot_be_had_is_an_error_and_the_pool_stays_usable() {
        let mut pool = StagingPool::new();
        pool.take(&[5000]);
        assert_eq!(
            pool.try_take(&[10, usize::MAX / 2]).err(),
            Some(usize::MAX / 2)
        );
        assert_eq!(pool.try_take(&[10, 20]).unwrap()[1].len(), 20);
    }
}
