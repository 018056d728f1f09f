//! What the start-up scan does with the files of one block in one volume: the decision only,
//! no I/O, so every combination of half-done renames between `rbw/` and `finalized/` is a
//! table row in the tests (docs/datanode.md "Start-up scan" gives the same table).
//!
//! In order:
//! 1. Of several metadata files in one directory only the newest generation stamp is kept; the
//!    others are stale (a restamp or a replacement whose removal did not reach the disk).
//! 2. A name in `rbw/` that is the same inode as the name in `finalized/` is the source of a
//!    rename whose removal did not reach the disk: the `rbw/` name is unlinked.
//! 3. A pair split across the two directories — one file in `finalized/`, the other in `rbw/`,
//!    nothing else — is a finalize cut between its renames: the `rbw/` file is moved in (roll
//!    forward). Either order of the two renames is completed.
//! 4. Each directory holding both files is a candidate: the newest generation stamp first,
//!    `finalized/` winning a tie. The first candidate that validates (see `super`) is the
//!    replica; every other file of the block is then removed.
//!    (An `rbw/` pair whose metadata file is shorter than its header was created but never
//!    hsynced before a power cut: the executor removes it instead of validating it.)
//! 5. A file without its partner in its directory (a lone block or metadata file) is an orphan
//!    of an interrupted create or delete: removed. Nothing acknowledged can be lost that way —
//!    a create's two names and a finalize's destination are fsynced before any ack.

use sluice_common::GenerationStamp;
use std::cmp::Reverse;

/// Device and inode of a file: two names of one file are a rename half done.
pub(crate) type Inode = (u64, u64);

/// The block file of one block in one directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockFile {
    /// Its length in bytes.
    pub len: u64,
    /// Its inode.
    pub ino: Inode,
}

/// A metadata file of one block in one directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MetaFile {
    /// The generation stamp in its name.
    pub gs: GenerationStamp,
    /// Its inode.
    pub ino: Inode,
}

/// The files of one block found in one directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// `blk_<id>`, if present.
    pub block: Option<BlockFile>,
    /// Every `blk_<id>_<gs>.meta`.
    pub metas: Vec<MetaFile>,
}

impl Found {
    fn meta(&self) -> Option<MetaFile> {
        self.metas.iter().max_by_key(|m| m.gs).copied()
    }

    fn pair(&self) -> Option<(u64, GenerationStamp)> {
        Some((self.block?.len, self.meta()?.gs))
    }
}

/// Which directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// `current/rbw/`.
    Rbw,
    /// `current/finalized/subdirN/`.
    Finalized,
}

/// Which file of the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `blk_<id>`.
    Block,
    /// `blk_<id>_<gs>.meta`.
    Meta(GenerationStamp),
}

/// A pair of files that may be the replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Where the pair is.
    pub place: Place,
    /// Its generation stamp.
    pub gs: GenerationStamp,
    /// The block file's length.
    pub len: u64,
}

/// The scan's steps for one block, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Unlinked first: stale metadata files and `rbw/` names of a file also in `finalized/`.
    pub unlink: Vec<(Place, Kind)>,
    /// Then moved from `rbw/` into `finalized/` (roll forward), if any.
    pub roll_forward: Option<Kind>,
    /// Then tried in order; the first that validates is the replica.
    pub candidates: Vec<Candidate>,
    /// Lone files, removed in any case.
    pub orphans: Vec<(Place, Kind)>,
}

impl Plan {
    /// The files of candidate `c` (removed when another candidate is the replica).
    pub fn files_of(c: &Candidate) -> [(Place, Kind); 2] {
        [(c.place, Kind::Meta(c.gs)), (c.place, Kind::Block)]
    }
}

/// Decides what to do with the files of one block: `fin` found in `finalized/`, `rbw` in
/// `rbw/` of the same volume.
pub(crate) fn plan(fin: &Found, rbw: &Found) -> Plan {
    let mut p = Plan::default();
    let (mut f, mut r) = (fin.clone(), rbw.clone());
    for (place, found) in [(Place::Finalized, &mut f), (Place::Rbw, &mut r)] {
        if let Some(newest) = found.meta() {
            for m in found.metas.iter().filter(|m| m.gs != newest.gs) {
                p.unlink.push((place, Kind::Meta(m.gs)));
            }
            found.metas = vec![newest];
        }
    }
    if let (Some(a), Some(b)) = (f.block, r.block) {
        if a.ino == b.ino {
            p.unlink.push((Place::Rbw, Kind::Block));
            r.block = None;
        }
    }
    if let (Some(a), Some(b)) = (f.meta(), r.meta()) {
        if a.ino == b.ino && a.gs == b.gs {
            p.unlink.push((Place::Rbw, Kind::Meta(b.gs)));
            r.metas.clear();
        }
    }
    match (f.block, f.meta(), r.block, r.meta()) {
        (None, Some(_), Some(_), None) => {
            p.roll_forward = Some(Kind::Block);
            f.block = r.block.take();
        }
        (Some(_), None, None, Some(m)) => {
            p.roll_forward = Some(Kind::Meta(m.gs));
            f.metas = std::mem::take(&mut r.metas);
        }
        _ => {}
    }
    for (place, found) in [(Place::Finalized, &f), (Place::Rbw, &r)] {
        match (found.pair(), found.block, found.meta()) {
            (Some((len, gs)), _, _) => p.candidates.push(Candidate { place, gs, len }),
            (None, Some(_), None) => p.orphans.push((place, Kind::Block)),
            (None, None, Some(m)) => p.orphans.push((place, Kind::Meta(m.gs))),
            _ => {}
        }
    }
    p.candidates
        .sort_by_key(|c| Reverse((c.gs, c.place == Place::Finalized)));
    p
}
