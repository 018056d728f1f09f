//! Local storage: volumes, the replica layout and metadata files, replica states, the replica
//! map and the start-up scan. Everything here is blocking file I/O.

pub mod dataset;
pub mod layout;
pub mod meta;
pub mod replica;
pub(crate) mod scan;
pub mod volume;

#[cfg(test)]
mod tests;
