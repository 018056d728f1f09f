//! Write-path protocol tests against a fake metadata service and fake DataNodes.

use crate::support::*;
use sluice_client::{ClientError, ConnectOptions, FileSystem, PipelineFailure, WriteOptions};
use sluice_common::config::HumanDuration;
use sluice_common::proto::{BlockStage, HEARTBEAT_SEQNO};
use sluice_common::{MetaError, Status};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

fn opts(block_size: u64) -> WriteOptions {
    WriteOptions {
        block_size: Some(block_size),
        ..WriteOptions::default()
    }
}

#[tokio::test]
async fn write_cuts_aligned_packets_per_block_and_completes_with_the_last_block() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let data = random_bytes(10_000, 1);
        let mut w = fs.create("/f", opts(4096)).await.unwrap();
        for piece in data.chunks(777) {
            w.write_all(piece).await.unwrap();
        }
        assert_eq!(w.bytes_written(), 10_000);
        w.close().await.unwrap();
        w.close().await.unwrap(); // idempotent

        let st = dn.st();
        assert!(st.violations.is_empty(), "{:?}", st.violations);
        let mut ids: Vec<u64> = st.blocks.keys().copied().collect();
        ids.sort();
        assert_eq!(ids.len(), 3);
        let joined: Vec<u8> = ids.iter().flat_map(|id| st.blocks[id].clone()).collect();
        assert_eq!(joined, data);
        assert_eq!(st.finalized.len(), 3);
        for h in st.packets.iter().filter(|h| h.seqno >= 0) {
            assert_eq!(h.offset_in_block % 512, 0);
            assert!(h.offset_in_block + u64::from(h.data_len) <= 4096);
            assert!(h.data_len <= 1024);
        }
        drop(st);
        let m = meta.st();
        let prevs: Vec<Option<u64>> = m
            .add_block_calls
            .iter()
            .map(|c| c.0.map(|b| b.num_bytes))
            .collect();
        assert_eq!(prevs, vec![None, Some(4096), Some(4096)]);
        let last = m.completes.last().unwrap().unwrap();
        assert_eq!(last.num_bytes, 10_000 - 8192);
    })
    .await;
}

#[tokio::test]
async fn hflush_makes_data_visible_and_resends_the_partial_chunk() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let data = random_bytes(2000, 2);
        let mut w = fs.create("/h", opts(1 << 20)).await.unwrap();
        w.write_all(&data[..700]).await.unwrap();
        w.hflush().await.unwrap();
        let id = *dn.st().blocks.keys().next().unwrap();
        assert_eq!(dn.st().blocks[&id], data[..700]);
        w.write_all(&data[700..]).await.unwrap();
        w.hsync().await.unwrap();
        {
            let st = dn.st();
            assert_eq!(st.blocks[&id], data);
            assert!(st.violations.is_empty(), "{:?}", st.violations);
            let data_packets: Vec<_> = st.packets.iter().filter(|h| h.seqno >= 0).collect();
            assert_eq!(data_packets[0].offset_in_block, 0);
            // The next packet starts again at the partial chunk.
            assert_eq!(data_packets[1].offset_in_block, 512);
            assert!(data_packets.last().unwrap().sync);
        }
        assert_eq!(meta.st().fsyncs, vec![2000]);
        // hsync with nothing new sends no data but still returns.
        w.hsync().await.unwrap();
        w.close().await.unwrap();
        assert_eq!(meta.st().completes.last().unwrap().unwrap().num_bytes, 2000);
    })
    .await;
}

#[tokio::test]
async fn an_error_ack_takes_the_node_out_and_recovery_finishes_the_file_on_the_survivor() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let dn2 = start_dn("dn2").await; // named in the pipeline; the fake dn1 answers for it
        let meta = start_meta(vec![dn.id.clone(), dn2.id.clone()]).await;
        dn.st().fail_ack = Some((1, 1, Status::ErrorChecksum));
        let fs = connect(config(&meta)).await;
        let data = random_bytes(5000, 3);
        let mut w = fs.create("/bad", opts(1 << 20)).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.close().await.unwrap();
        assert_eq!(w.pipeline_recoveries(), 1);
        assert_eq!(w.bytes_acked(), 5000);
        let st = dn.st();
        assert!(st.violations.is_empty(), "{:?}", st.violations);
        assert_eq!(
            st.stages,
            vec![BlockStage::Create, BlockStage::StreamingRecovery]
        );
        assert_eq!(st.blocks.values().next().unwrap(), &data);
        drop(st);
        let m = meta.st();
        // Packet 0 (1 KiB) was acknowledged before packet 1 failed at dn2.
        let (old, new, nodes) = m.pipeline_updates[0].clone();
        assert_eq!((old.num_bytes, new.num_bytes), (1024, 1024));
        assert!(new.gen_stamp > old.gen_stamp);
        assert_eq!(nodes, vec![dn.id.node_id.clone()]);
        let last = m.completes.last().unwrap().unwrap();
        assert_eq!((last.gen_stamp, last.num_bytes), (new.gen_stamp, 5000));
    })
    .await;
}

#[tokio::test]
async fn a_refused_recovery_fails_the_write_and_close_repeats_the_error() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let dn2 = start_dn("dn2").await;
        let meta = start_meta(vec![dn.id.clone(), dn2.id.clone()]).await;
        meta.st().refuse_recovery = true;
        dn.st().fail_ack = Some((1, 1, Status::ErrorChecksum));
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/refused", opts(1 << 20)).await.unwrap();
        let r = w.write_all(&random_bytes(5000, 3)).await;
        let flushed = match r {
            Ok(()) => w.hflush().await,
            Err(e) => Err(client_error(e)),
        };
        let err = flushed.expect_err("recovery was refused");
        assert!(
            matches!(err, ClientError::Meta(MetaError::UnknownBlock { .. })),
            "{err:?}"
        );
        let again = w.close().await.expect_err("close repeats the first error");
        assert_eq!(again.to_string(), err.to_string());
        assert!(w.write_all(b"more").await.is_err(), "write after failure");
        assert_eq!(
            w.bytes_acked(),
            1024,
            "nothing past the last ack is claimed"
        );
    })
    .await;
}

#[tokio::test]
async fn a_failure_on_the_last_packet_is_finished_by_close_recovery() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let dn2 = start_dn("dn2").await;
        let meta = start_meta(vec![dn.id.clone(), dn2.id.clone()]).await;
        // 3000 bytes in 1 KiB packets: seqnos 0..=2 carry data, 3 is the last packet.
        dn.st().fail_ack = Some((3, 1, Status::Error));
        let fs = connect(config(&meta)).await;
        let data = random_bytes(3000, 8);
        let mut w = fs.create("/closing", opts(1 << 20)).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.close().await.unwrap();
        let st = dn.st();
        assert_eq!(
            st.stages,
            vec![BlockStage::Create, BlockStage::CloseRecovery]
        );
        assert_eq!(st.blocks.values().next().unwrap(), &data);
        let m = meta.st();
        let (_, new, nodes) = m.pipeline_updates[0].clone();
        assert_eq!((new.num_bytes, nodes), (3000, vec![dn.id.node_id.clone()]));
        assert_eq!(m.completes.last().unwrap().unwrap(), new);
    })
    .await;
}

fn client_error(e: std::io::Error) -> ClientError {
    e.get_ref()
        .and_then(|r| r.downcast_ref::<ClientError>())
        .cloned()
        .expect("the io::Error carries the ClientError")
}

#[tokio::test]
async fn setup_failure_abandons_the_block_and_excludes_the_bad_node() {
    within(20, async {
        let bad = start_dn("bad").await;
        let good = start_dn("good").await;
        bad.st().refuse_setup = Some((Status::Error, None));
        let meta = start_meta(vec![bad.id.clone(), good.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/retry", opts(1 << 20)).await.unwrap();
        w.write_all(&random_bytes(3000, 4)).await.unwrap();
        w.close().await.unwrap();
        let m = meta.st();
        assert_eq!(m.abandoned.len(), 1);
        assert_eq!(m.add_block_calls.len(), 2);
        assert_eq!(m.add_block_calls[1].1, vec![bad.id.node_id.clone()]);
        assert_eq!(good.st().blocks.values().next().unwrap().len(), 3000);
    })
    .await;
}

#[tokio::test]
async fn setup_gives_up_after_the_retries_naming_the_nodes_tried() {
    within(20, async {
        let dns = [
            start_dn("a").await,
            start_dn("b").await,
            start_dn("c").await,
        ];
        for d in &dns {
            d.st().refuse_setup = Some((Status::ErrorIo, None));
        }
        let meta = start_meta(dns.iter().map(|d| d.id.clone()).collect()).await;
        let mut cfg = config(&meta);
        cfg.block_write_retries = 1;
        let fs = connect(cfg).await;
        let mut w = fs.create("/nope", opts(1 << 20)).await.unwrap();
        w.write_all(b"x").await.unwrap();
        match w.close().await {
            Err(ClientError::PipelineSetup {
                attempts,
                tried,
                last,
                ..
            }) => {
                assert_eq!(attempts, 2);
                let tried: Vec<_> = tried.iter().map(|d| &d.node_id).collect();
                assert_eq!(tried, [&dns[0].id.node_id, &dns[1].id.node_id]);
                // The last set-up failure names the DataNode and the status it answered.
                match *last {
                    ClientError::Pipeline { failure, .. } => {
                        assert!(
                            matches!(*failure, PipelineFailure::Setup { .. }),
                            "{failure:?}"
                        );
                        assert_eq!(failure.node().node_id, dns[1].id.node_id);
                        assert_eq!(failure.status(), Some(Status::ErrorIo));
                    }
                    other => panic!("unexpected last failure {other:?}"),
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn first_bad_link_is_the_node_excluded() {
    within(20, async {
        let first = start_dn("first").await;
        let second = start_dn("second").await;
        first.st().refuse_setup = Some((Status::Error, Some(second.id.data_addr.clone())));
        let meta = start_meta(vec![first.id.clone(), second.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/link", opts(1 << 20)).await.unwrap();
        w.write_all(b"hello").await.unwrap();
        // `first` keeps refusing: after excluding `second`, `first` is tried again, then
        // excluded; nothing is left, which the error says after naming both.
        let err = w.close().await.expect_err("no good node");
        let m = meta.st();
        assert_eq!(m.add_block_calls[1].1, vec![second.id.node_id.clone()]);
        match &err {
            ClientError::PipelineSetup { tried, last, .. } => {
                // The first set-up blamed the first bad link, not the DataNode that answered.
                let tried: Vec<_> = tried.iter().map(|d| &d.node_id).collect();
                assert_eq!(tried, [&second.id.node_id, &first.id.node_id]);
                assert!(
                    matches!(
                        last.as_ref(),
                        ClientError::Meta(MetaError::NotEnoughDatanodes { .. })
                    ),
                    "{last:?}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn empty_file_is_created_and_completed_without_blocks() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/empty", WriteOptions::default()).await.unwrap();
        w.close().await.unwrap();
        let m = meta.st();
        assert!(m.add_block_calls.is_empty());
        assert_eq!(m.completes, vec![None]);
    })
    .await;
}

#[tokio::test]
async fn complete_and_add_block_are_retried_with_backoff() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        meta.st().complete_false = 2;
        meta.st().not_replicated_yet = 1;
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/slow", opts(1 << 20)).await.unwrap();
        w.write_all(&random_bytes(100, 5)).await.unwrap();
        w.close().await.unwrap();
        let m = meta.st();
        assert_eq!(m.completes.len(), 3);
        assert_eq!(m.add_block_calls.len(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_full_window_blocks_writes_and_a_silent_pipeline_times_out() {
    within(20, async {
        let dn = start_dn("dn1").await;
        dn.st().stall_acks = true;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let mut cfg = config(&meta);
        cfg.write_max_packets_in_flight = 3;
        cfg.socket_timeout = HumanDuration::millis(1500);
        let fs = connect(cfg).await;
        let mut w = fs.create("/stall", opts(1 << 20)).await.unwrap();
        let data = random_bytes(20 * 1024, 6);
        // Backpressure: with 3 packets unacknowledged the writer cannot go on.
        let blocked = tokio::time::timeout(Duration::from_millis(300), w.write_all(&data)).await;
        assert!(blocked.is_err(), "write_all must block on a full window");
        let sent = dn.st().packets.iter().filter(|h| h.seqno >= 0).count();
        assert!(sent <= 3, "{sent} packets sent with a window of 3");
        // No ack within the socket timeout: the first (and only) DataNode is blamed, and no
        // DataNode is left to recover with.
        let err = w.close().await.expect_err("timed out");
        match err {
            ClientError::AllDatanodesBad { nodes, last, .. } => {
                assert_eq!(nodes, std::slice::from_ref(&dn.id));
                assert!(
                    matches!(&*last, PipelineFailure::AckTimeout { node, .. } if node.node_id == dn.id.node_id),
                    "{last:?}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn an_idle_pipeline_sends_heartbeats() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let mut cfg = config(&meta);
        cfg.socket_timeout = HumanDuration::millis(400);
        let fs = connect(cfg).await;
        let mut w = fs.create("/idle", opts(1 << 20)).await.unwrap();
        w.write_all(b"some bytes").await.unwrap();
        w.hflush().await.unwrap();
        wait_for(Duration::from_secs(10), "two heartbeats", || {
            dn.st().heartbeats >= 2
        })
        .await;
        assert!(dn.st().packets.iter().any(|h| h.seqno == HEARTBEAT_SEQNO));
        w.write_all(b" and more").await.unwrap();
        w.close().await.unwrap();
        let st = dn.st();
        assert_eq!(st.blocks.values().next().unwrap(), b"some bytes and more");
        assert!(st.violations.is_empty(), "{:?}", st.violations);
    })
    .await;
}

#[tokio::test]
async fn leases_are_renewed_while_a_writer_is_open() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let opts_fast = ConnectOptions {
            lease_renew_interval: Duration::from_millis(50),
        };
        let fs = FileSystem::connect_with(config(&meta), opts_fast)
            .await
            .unwrap();
        assert!(fs.client_name().starts_with("sluice-client-"));
        let mut w = fs.create("/lease", WriteOptions::default()).await.unwrap();
        wait_for(Duration::from_secs(10), "two lease renewals", || {
            meta.st().renewals >= 2
        })
        .await;
        w.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn hsync_after_hflush_sends_an_empty_sync_packet() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/sync", opts(1 << 20)).await.unwrap();
        w.write_all(&random_bytes(700, 9)).await.unwrap();
        w.hflush().await.unwrap();
        w.hsync().await.unwrap();
        {
            let st = dn.st();
            let last = st.packets.iter().rfind(|h| h.seqno >= 0).unwrap();
            assert_eq!((last.data_len, last.sync, last.last), (0, true, false));
            assert_eq!(
                last.offset_in_block, 512,
                "the chunk holding the end of the data"
            );
            assert!(st.violations.is_empty(), "{:?}", st.violations);
        }
        assert_eq!(meta.st().fsyncs, vec![700]);
        w.close().await.unwrap();
    })
    .await;
}
