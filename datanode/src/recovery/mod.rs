//! Block recovery on the DataNode (lease recovery of a file whose writer disappeared):
//!
//! - [`length`]: HDFS's rules for the length the replicas agree on (a pure function);
//! - `serve`: the `InitReplicaRecovery` and `UpdateReplicaUnderRecovery` ops every location
//!   answers (the disk side is `storage::dataset`'s recovery methods);
//! - `worker`: the primary's task for a `RecoverBlock` command, which ends with
//!   `commit_block_synchronization` to the metadata service.
//!
//! See `docs/recovery.md` for the whole conversation.

pub mod length;
pub(crate) mod serve;
pub(crate) mod worker;
