//! A buffered replica's failed flush or fsync reaches the writer as an error ack, never a
//! success for bytes that are not durable (run with `--features failpoints`). The test holds
//! `crate::scenario()` (the `fail` registry is global to the process); points are scoped to one node.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use sluice_common::config::Millis;
use sluice_common::proto::*;
use sluice_common::Status;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_and_fsync_failures_of_a_buffered_replica_fail_hsync_and_close() {
    let _failpoints = crate::scenario();
    within(60, async {
        let (meta_addr, _) = fake_meta().await;
        let tmp = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        for i in 0..2 {
            let dirs = vec![tmp.path().join(format!("n{i}"))];
            let mut cfg = config(meta_addr, &dirs);
            cfg.write_buffer_idle_flush_timeout = Millis::new(0);
            nodes.push(Node::start_on(meta_addr, dirs, Some(cfg)).await);
        }
        let (n1, n2) = (&nodes[0], &nodes[1]);
        let p2 = n2.addr().port();
        let data = random_bytes(300_000, 1);

        // hsync: n2 (last, buffered) fails its fsync; the writer sees n2's ERROR.
        fail::cfg("dn::before_fsync", &format!("return({p2}:error)")).unwrap();
        let mut c = Client::connect(n1.addr()).await;
        let r = c
            .op(write_op(block(1, 1, 0), BlockStage::Create, vec![n2.id()]))
            .await;
        assert_eq!(r.status, Status::Success);
        let seq = send_data(&mut c, &data, 0, 0).await;
        expect_acks(&mut c, seq as usize, 2).await;
        // An empty sync packet at the current chunk boundary, as the client sends it.
        c.packet(seq, data.len() as u64 / 512 * 512, &[], false, true)
            .await;
        let a = c.ack().await.unwrap();
        assert_eq!(
            a.replies,
            vec![Status::Success, Status::Error],
            "hsync not acked as durable"
        );

        // close: the fsync at finalize fails (sync.on.close) — the last packet is not acked.
        let mut c = Client::connect(n1.addr()).await;
        let r = c
            .op(write_op(block(2, 1, 0), BlockStage::Create, vec![n2.id()]))
            .await;
        assert_eq!(r.status, Status::Success);
        let seq = send_data(&mut c, &data, 0, 0).await;
        expect_acks(&mut c, seq as usize, 2).await;
        c.packet(seq, data.len() as u64, &[], true, false).await;
        let a = c.ack().await.unwrap();
        assert_eq!(
            a.replies,
            vec![Status::Success, Status::Error],
            "close not acked"
        );
        fail::remove("dn::before_fsync");

        // close: the buffer's write to the block file fails.
        fail::cfg("dn::flush", &format!("return({p2}:error)")).unwrap();
        let mut c = Client::connect(n1.addr()).await;
        let r = c
            .op(write_op(block(3, 1, 0), BlockStage::Create, vec![n2.id()]))
            .await;
        assert_eq!(r.status, Status::Success);
        let seq = send_data(&mut c, &data, 0, 0).await;
        expect_acks(&mut c, seq as usize, 2).await;
        c.packet(seq, data.len() as u64, &[], true, false).await;
        let a = c.ack().await.unwrap();
        assert_eq!(
            a.replies,
            vec![Status::Success, Status::Error],
            "close not acked"
        );
        fail::remove("dn::flush");

        // Without failpoints the same pipeline closes cleanly.
        write_block(n1.addr(), vec![n2.id()], block(4, 1, 0), &data).await;
        let (_, got) = read_block(n2.addr(), block(4, 1, 0), 0, u64::MAX).await;
        assert!(got == data);
        assert!(n2.dn().metrics().buffered_replicas_created.get() >= 4);
    })
    .await
}
