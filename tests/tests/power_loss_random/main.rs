//! Seeded random power cuts on the lazyfs rig (PowerCluster): a binary of its own, as every test that
//! cuts the power under the metadata store. A cut can leave sled's flush waiting for ever on an
//! I/O thread that died of the mount's EIO, holding the store's process-wide I/O lock (sled
//! 0.34 needs one, see `metadata/src/store.rs`); in a process of its own that wedges no other
//! test's store.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod power_loss_random;
