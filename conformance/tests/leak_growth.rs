//! The leak check against a real leak, in a test binary of its own: the
//! check reads the whole process (resident memory, malloc's bytes in use,
//! threads), so other tests allocating and freeing beside it on the test
//! harness's threads would blur it, as they do not in `polychip conform`'s
//! worker, which runs one case at a time.

use std::time::Duration;

use polychip_conformance::leaks::growth;

#[test]
fn a_real_leak_in_this_process_is_seen_and_no_leak_is_not() {
    if !std::path::Path::new("/proc/self/status").exists() {
        eprintln!("skipped: no /proc/self/status, which the leak check reads");
        return;
    }
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let found = growth(|| {
        // 256 KiB a call, touched so that it is resident.
        kept.push(vec![1u8; 256 << 10]);
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    });
    assert!(
        found
            .as_ref()
            .is_some_and(|m| m.contains("memory keeps growing")),
        "{found:?}"
    );
    let mut nothing = 0u64;
    let quiet = growth(|| {
        nothing += 1;
        Ok(())
    });
    assert_eq!(quiet, None);
}
