//! Sluice's end-to-end failpoint tests, one binary (`--features failpoints`, which
//! `--all-features` enables). The `fail` registry is global to the process: every test holds
//! [`scenario`], so they run one at a time and none leaves a failpoint behind, even when it
//! fails.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod recovery_failpoints;

pub use sluice_tests::failpoint_scenario as scenario;

/// A test that panics with a failpoint set leaves nothing behind for the next one.
#[allow(clippy::disallowed_methods)] // a test's own thread, joined by the test
#[test]
fn a_panicking_test_leaves_no_failpoint_behind() {
    let panicked = std::thread::spawn(|| {
        let _failpoints = scenario();
        assert!(fail::cfg("dn::setup", "return(*:drop)").is_ok());
        assert_eq!(fail::list().len(), 1);
        panic!("a failing test");
    })
    .join();
    assert!(panicked.is_err(), "the scenario thread panics");
    let _failpoints = scenario();
    assert_eq!(
        fail::list(),
        Vec::new(),
        "the panicking test's failpoint is cleared"
    );
}
