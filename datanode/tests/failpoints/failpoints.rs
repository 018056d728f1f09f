//! Failpoints scoped to one DataNode (run with `--features failpoints`). The test holds
//! `crate::scenario()`: the `fail` registry is global to the process.

use crate::support::*;
use sluice_common::proto::*;
use sluice_common::Status;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failpoints_fire_only_on_the_node_they_name() {
    let _failpoints = crate::scenario();
    within(60, async {
        let (meta_addr, _) = fake_meta().await;
        let (n1, n2) = (Node::start(meta_addr).await, Node::start(meta_addr).await);
        let data = random_bytes(1024, 9);
        let p2 = n2.addr().port();

        // error: DN2 fails its local write; DN1 passes DN2's status on after its own.
        fail::cfg("dn::before_write", &format!("return({p2}:error)")).unwrap();
        let mut c = Client::connect(n1.addr()).await;
        assert_eq!(
            c.op(write_op(block(20, 1, 0), BlockStage::Create, vec![n2.id()]))
                .await
                .status,
            Status::Success
        );
        c.packet(0, 0, &data, false, false).await;
        let a = c.ack().await.unwrap();
        assert_eq!(a.replies, vec![Status::Success, Status::Error]);
        fail::remove("dn::before_write");

        // drop: DN2 closes the connection at set-up; DN1 names it as the first bad link.
        fail::cfg("dn::setup", &format!("return({p2}:drop)")).unwrap();
        let mut c = Client::connect(n1.addr()).await;
        let r = c
            .op(write_op(block(21, 1, 0), BlockStage::Create, vec![n2.id()]))
            .await;
        assert_eq!(r.status, Status::Error);
        assert_eq!(r.first_bad_link, Some(n2.id().data_addr));
        // A failpoint naming another node leaves these two alone.
        fail::cfg("dn::setup", "return(1:drop)").unwrap();
        write_block(n1.addr(), vec![n2.id()], block(22, 1, 0), &data).await;
        fail::remove("dn::setup");

        // error before an ack on DN1 only.
        fail::cfg(
            "dn::before_ack",
            &format!("return({}:error)", n1.addr().port()),
        )
        .unwrap();
        let mut c = Client::connect(n1.addr()).await;
        assert_eq!(
            c.op(write_op(block(23, 1, 0), BlockStage::Create, vec![n2.id()]))
                .await
                .status,
            Status::Success
        );
        c.packet(0, 0, &data, false, false).await;
        assert_eq!(c.ack().await.unwrap().replies, vec![Status::Error]);
        assert!(c.next().await.is_none(), "closed after the failure");
        fail::remove("dn::before_ack");
    })
    .await
}
