//! ABI rule 13: a plugin leaves the process state it does not own as it
//! found it. The host reads it around loading each plugin and the
//! conformance suite around each case; what the host or the calling thread
//! owns is put back, and every change is named. One test in a binary of its
//! own: the fake plugins change the whole process (its working directory,
//! a signal handler, the environment), which no other test should see.

mod common;

use polychip_conformance::cases::{Tier, registry};
use polychip_conformance::runner::Status;
use polychip_conformance::suite::{Unit, run_unit};
use polychip_conformance::waivers::Waivers;
use polychip_host::DType;
use polychip_host::ffi::procstate::ProcState;

#[test]
fn process_state_a_plugin_changes_is_put_back_where_the_host_may_and_named() {
    // Built first: compiling runs a compiler in the working directory.
    let taking_over = common::fake_plugin(Some("FAKE_CTOR_PROCESS_STATE"));
    let good = common::fake_plugin(None);
    let blocking = common::fake_plugin(Some("FAKE_FILL_BLOCKS_SIGNALS"));

    // Loading: a constructor moves to /, takes SIGINT and sets a variable.
    let cwd = std::env::current_dir().unwrap();
    let device = common::first_device(&taking_over);
    assert_eq!(
        std::env::current_dir().unwrap(),
        cwd,
        "the directory is put back"
    );
    // The directory is forbidden; the handler and the variable, which
    // real drivers' runtimes set (PoCL's LLVM), only noted.
    let findings = device.plugin().load_findings();
    assert_eq!(findings.len(), 1, "{findings:?}");
    for want in [
        "while loading",
        "the working directory changed from ",
        "ABI rule 13",
    ] {
        assert!(
            findings[0].contains(want),
            "{want:?} missing from: {}",
            findings[0]
        );
    }
    let notes = device.plugin().load_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    for want in [
        "the process's handler for SIGINT changed",
        "the environment changed (FAKE_PLUGIN_WAS_HERE)",
        "ABI rule 13 discourages",
    ] {
        assert!(
            notes[0].contains(want),
            "{want:?} missing from: {}",
            notes[0]
        );
    }
    // A plugin that changes nothing has nothing said about it.
    let device = common::first_device(&good);
    assert_eq!(device.plugin().load_findings(), Vec::<String>::new());
    assert_eq!(device.plugin().load_notes(), Vec::<String>::new());

    // A call: fill leaves SIGUSR1 blocked and the thread pinned. Every
    // conformance case of fill fails with it, and the calling thread is
    // left as it was.
    let before = ProcState::current();
    let device = common::first_device(&blocking);
    let fill = registry().into_iter().find(|op| op.name == "fill").unwrap();
    let unit = Unit {
        op: fill,
        dtype: DType::F32,
        tier: Tier::Default,
    };
    let mut results = Vec::new();
    run_unit(&device, unit, 0, None, &Waivers::default(), |r| {
        results.push(r)
    });
    let named: Vec<_> = results
        .iter()
        .filter(|r| {
            r.status == Status::Failed
                && r.message
                    .contains("the calling thread's signal mask changed (blocked SIGUSR1)")
                && r.message.contains("while running this case")
        })
        .collect();
    assert!(
        !named.is_empty(),
        "no fill case named the blocked signal: {:?}",
        results.iter().map(|r| &r.message).collect::<Vec<_>>()
    );
    // Pinning shows only where the thread may run on more than one CPU.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus > 1 {
        assert!(
            named[0].message.contains("CPU affinity changed from CPUs"),
            "{}",
            named[0].message
        );
    }
    assert!(before.changes_to(&ProcState::current()).is_empty());
}
