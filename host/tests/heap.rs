//! `ffi::heap::heap_in_use` in a test binary of its own: it reads the
//! whole process's allocator, which tests allocating beside it would blur.

use polychip_host::ffi::heap::heap_in_use;

#[test]
fn a_kept_allocation_shows_and_a_freed_one_does_not() {
    let Some(before) = heap_in_use() else {
        eprintln!("skipped: this C library has no mallinfo2");
        return;
    };
    let kept = std::hint::black_box(vec![7u8; 1 << 20]);
    let during = heap_in_use().unwrap();
    assert!(during >= before + (1 << 19), "{before} {during}");
    drop(kept);
    let after = heap_in_use().unwrap();
    assert!(after < during, "{during} {after}");
}
