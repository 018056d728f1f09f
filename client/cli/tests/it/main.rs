//! The `sluice` command's integration tests, one binary: the real binary against the fakes
//! (`cli`), `sluice local` as a process (`local`) and every benchmark on tiny embedded clusters
//! (`bench`), the HDD disk profile's cgroups (`disk_profile`), the seeking-disk daemon (`hddfs`), and the `hdfs dfs` verbs
//! against `sluice local` (`verbs`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod bench;
mod cli;
mod disk_profile;
mod hddfs;
mod local;
mod verbs;
