//! Bytes the C allocator has handed out and not had back: what a leak of
//! `malloc`ed memory grows even while the process's resident memory does
//! not (freed pages the allocator keeps are reused first).

/// Bytes in use from `malloc` in every arena (small blocks and mapped
/// ones), from glibc's `mallinfo2`; `None` where the C library has no such
/// function (looked up when called, so the host still loads on an older
/// or another C library).
pub fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        type MallInfo2 = unsafe extern "C" fn() -> libc::mallinfo2;
        static ENTRY: std::sync::OnceLock<Option<MallInfo2>> = std::sync::OnceLock::new();
        let entry = ENTRY.get_or_init(|| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only
            // looks the symbol up.
            let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) };
            // SAFETY: glibc's `mallinfo2` has this signature (glibc 2.33+).
            (!symbol.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, MallInfo2>(symbol) })
        });
        // SAFETY: mallinfo2 takes no arguments and returns a struct by value.
        let info = unsafe { (*entry)?() };
        Some((info.uordblks as u64).saturating_add(info.hblkhd as u64))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}
