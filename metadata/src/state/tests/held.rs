//! Commands a change implies leave only once the change is durable: replica deletions of a
//! deleted or overwritten file, and (in `lease`) recovery ids.

use super::*;

/// Every `Delete` of the heartbeat replies of dn0..dn2, without flushing first.
fn deletes_now(s: &mut State) -> Vec<ExtendedBlock> {
    (0..3)
        .flat_map(|i| s.heartbeat(&hb(&format!("dn{i}")), Instant::now()).commands)
        .flat_map(|c| match c {
            DatanodeCommand::Delete { blocks } => blocks,
            _ => vec![],
        })
        .collect()
}

fn flush(s: &State) {
    futures::executor::block_on(s.store().flush()).unwrap();
}

fn written(s: &mut State) -> Vec<ExtendedBlock> {
    with_nodes(s, 3);
    let blocks = must_write(s, "/f", &[100, 50]);
    flush(s);
    assert!(deletes_now(s).is_empty());
    blocks
}

#[test]
fn deletions_of_a_deleted_file_wait_for_the_flush() {
    let mut s = must_state();
    let blocks = written(&mut s);
    assert!(s.delete("/f", false).unwrap());
    assert!(deletes_now(&mut s).is_empty(), "nothing before the flush");
    assert!(deletes_now(&mut s).is_empty(), "nor at the next heartbeat");
    flush(&s);
    let mut sent = deletes_now(&mut s);
    sent.sort_by_key(|b| b.id);
    sent.dedup();
    assert_eq!(sent, blocks, "every replica once the delete is durable");
}

#[test]
fn deletions_of_an_overwritten_file_wait_for_the_flush() {
    let mut s = must_state();
    let blocks = written(&mut s);
    let over = CreateOptions {
        overwrite: true,
        ..opts(CLIENT)
    };
    s.create("/f", &over, Instant::now()).unwrap();
    assert!(deletes_now(&mut s).is_empty());
    flush(&s);
    assert_eq!(deletes_now(&mut s).len(), 3 * blocks.len());
}

#[test]
fn nothing_leaves_after_a_failed_flush() {
    let store = Arc::new(MemStore::new());
    let mut s = open(&cfg(), store.clone());
    written(&mut s);
    assert!(s.delete("/f", false).unwrap());
    store.fail_flushes(true);
    assert!(futures::executor::block_on(store.flush()).is_err());
    // The service marks the clock failed (service.rs); then nothing is released.
    store.clock().fail();
    store.fail_flushes(false);
    futures::executor::block_on(store.flush()).unwrap();
    assert!(deletes_now(&mut s).is_empty());
}
