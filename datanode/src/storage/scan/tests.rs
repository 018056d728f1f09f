//! The start-up scan over every combination of a block's files in `rbw/` and `finalized/`
//! (docs/datanode.md "Start-up scan" is this table): real files in a temp volume, then
//! `Dataset::open`, then the replica found and the files left.

use crate::metrics::Metrics;
use crate::storage::dataset::Dataset;
use crate::storage::layout;
use crate::storage::meta::MetaHeader;
use sluice_common::proto::ReplicaState::{self, Finalized, Rwr};
use sluice_common::{checksum, BlockId};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Block 513 lives in `finalized/subdir2`.
const ID: BlockId = BlockId(513);
const LEN: usize = 1000;
const BPC: u32 = 512;

fn bytes(seed: u8) -> Vec<u8> {
    (0..LEN).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// The two directories of the volume under test.
struct Vol {
    rbw: PathBuf,
    fin: PathBuf,
}

impl Vol {
    fn block(&self, dir: &Path, data: &[u8]) {
        std::fs::write(dir.join("blk_513"), data).unwrap();
    }

    /// A meta file of stamp `gs` whose checksums cover `data`.
    fn meta(&self, dir: &Path, gs: u64, data: &[u8]) {
        let mut m = MetaHeader {
            bytes_per_checksum: BPC,
        }
        .encode()
        .to_vec();
        m.extend(checksum::compute(data, BPC));
        std::fs::write(dir.join(format!("blk_513_{gs}.meta")), m).unwrap();
    }

    fn pair(&self, dir: &Path, gs: u64, data: &[u8]) {
        self.block(dir, data);
        self.meta(dir, gs, data);
    }

    /// A second name for `name` (a rename whose unlink of the source did not reach the disk).
    fn link(&self, from: &Path, to: &Path, name: &str) {
        std::fs::hard_link(from.join(name), to.join(name)).unwrap();
    }

    fn mv(&self, from: &Path, to: &Path, name: &str) {
        std::fs::rename(from.join(name), to.join(name)).unwrap();
    }

    /// Every file left, as `rbw/NAME` or `fin/NAME`, sorted.
    fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (tag, dir) in [("fin", &self.fin), ("rbw", &self.rbw)] {
            for e in std::fs::read_dir(dir).unwrap() {
                out.push(format!(
                    "{tag}/{}",
                    e.unwrap().file_name().to_string_lossy()
                ));
            }
        }
        out.sort();
        out
    }
}

/// One combination: how the files are left, what the scan must make of them.
struct Case {
    name: &'static str,
    setup: fn(&Vol),
    /// State, generation stamp and bytes on disk of the replica found (`None`: none).
    expect: Option<(ReplicaState, u64, u64)>,
    /// Files left after the scan.
    left: &'static [&'static str],
    /// `corrupt_replicas_skipped` after the scan.
    corrupt: u64,
}

const FIN_PAIR: &[&str] = &["fin/blk_513", "fin/blk_513_1.meta"];
const RBW_PAIR: &[&str] = &["rbw/blk_513", "rbw/blk_513_1.meta"];
const FULL: u64 = LEN as u64;

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "both in finalized",
            setup: |v| v.pair(&v.fin, 1, &bytes(1)),
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "both in rbw",
            setup: |v| v.pair(&v.rbw, 1, &bytes(1)),
            expect: Some((Rwr, 1, FULL)),
            left: RBW_PAIR,
            corrupt: 0,
        },
        Case {
            name: "meta moved, block not (finalize cut between its renames)",
            setup: |v| {
                v.pair(&v.rbw, 1, &bytes(1));
                v.mv(&v.rbw, &v.fin, "blk_513_1.meta");
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "block moved, meta not (renames reached the disk out of order)",
            setup: |v| {
                v.pair(&v.rbw, 1, &bytes(1));
                v.mv(&v.rbw, &v.fin, "blk_513");
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "both renamed, sources not yet unlinked (same inodes in both)",
            setup: |v| {
                v.pair(&v.rbw, 1, &bytes(1));
                v.link(&v.rbw, &v.fin, "blk_513");
                v.link(&v.rbw, &v.fin, "blk_513_1.meta");
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "meta in both (same inode), block in rbw",
            setup: |v| {
                v.pair(&v.rbw, 1, &bytes(1));
                v.link(&v.rbw, &v.fin, "blk_513_1.meta");
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "block in both (same inode), meta in rbw",
            setup: |v| {
                v.pair(&v.rbw, 1, &bytes(1));
                v.link(&v.rbw, &v.fin, "blk_513");
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "duplicates: newer stamp in rbw wins over finalized",
            setup: |v| {
                v.pair(&v.fin, 1, &bytes(1));
                v.pair(&v.rbw, 2, &bytes(2));
            },
            expect: Some((Rwr, 2, FULL)),
            left: &["rbw/blk_513", "rbw/blk_513_2.meta"],
            corrupt: 0,
        },
        Case {
            name: "duplicates: newer stamp in finalized wins over rbw",
            setup: |v| {
                v.pair(&v.fin, 2, &bytes(2));
                v.pair(&v.rbw, 1, &bytes(1));
            },
            expect: Some((Finalized, 2, FULL)),
            left: &["fin/blk_513", "fin/blk_513_2.meta"],
            corrupt: 0,
        },
        Case {
            name: "duplicates: same stamp, separate copies, finalized wins",
            setup: |v| {
                v.pair(&v.fin, 1, &bytes(1));
                v.pair(&v.rbw, 1, &bytes(1));
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "duplicates: newer finalized copy corrupt, older rbw copy kept",
            setup: |v| {
                v.block(&v.fin, &bytes(2));
                v.meta(&v.fin, 2, &bytes(2)[..BPC as usize]);
                v.pair(&v.rbw, 1, &bytes(1));
            },
            expect: Some((Rwr, 1, FULL)),
            left: RBW_PAIR,
            corrupt: 1,
        },
        Case {
            name: "rbw block without meta (create or delete cut)",
            setup: |v| v.block(&v.rbw, &bytes(1)),
            expect: None,
            left: &[],
            corrupt: 0,
        },
        Case {
            name: "rbw meta without block",
            setup: |v| v.meta(&v.rbw, 1, &bytes(1)),
            expect: None,
            left: &[],
            corrupt: 0,
        },
        Case {
            name: "finalized block without meta (delete cut)",
            setup: |v| v.block(&v.fin, &bytes(1)),
            expect: None,
            left: &[],
            corrupt: 0,
        },
        Case {
            name: "finalized meta without block",
            setup: |v| v.meta(&v.fin, 1, &bytes(1)),
            expect: None,
            left: &[],
            corrupt: 0,
        },
        Case {
            name: "lone block in finalized (another inode) beside an rbw pair",
            setup: |v| {
                v.block(&v.fin, &bytes(3));
                v.pair(&v.rbw, 1, &bytes(1));
            },
            expect: Some((Rwr, 1, FULL)),
            left: RBW_PAIR,
            corrupt: 0,
        },
        Case {
            name: "lone block in rbw (another inode) beside a finalized pair",
            setup: |v| {
                v.pair(&v.fin, 1, &bytes(1));
                v.block(&v.rbw, &bytes(3));
            },
            expect: Some((Finalized, 1, FULL)),
            left: FIN_PAIR,
            corrupt: 0,
        },
        Case {
            name: "two metas in rbw: the older stamp is stale",
            setup: |v| {
                v.pair(&v.rbw, 2, &bytes(1));
                v.meta(&v.rbw, 1, &bytes(1));
            },
            expect: Some((Rwr, 2, FULL)),
            left: &["rbw/blk_513", "rbw/blk_513_2.meta"],
            corrupt: 0,
        },
        Case {
            name: "finalized meta does not cover its block: corrupt, kept, not served",
            setup: |v| {
                v.block(&v.fin, &bytes(1));
                v.meta(&v.fin, 1, &bytes(1)[..BPC as usize]);
            },
            expect: None,
            left: FIN_PAIR,
            corrupt: 1,
        },
        Case {
            name: "rolled forward but the meta does not cover the block: not served",
            setup: |v| {
                v.block(&v.rbw, &bytes(1));
                v.meta(&v.fin, 1, &bytes(1)[..BPC as usize]);
            },
            expect: None,
            left: FIN_PAIR,
            corrupt: 1,
        },
        Case {
            name:
                "rbw block longer than its checksums, torn last chunk: cut to the last good chunk",
            setup: |v| {
                let mut torn = bytes(1);
                v.meta(&v.rbw, 1, &torn);
                torn[LEN - 1] ^= 0xff;
                torn.extend([9u8; 100]);
                v.block(&v.rbw, &torn);
            },
            expect: Some((Rwr, 1, BPC as u64)),
            left: RBW_PAIR,
            corrupt: 0,
        },
        Case {
            name: "rbw chunk garbled before the last one (power cut): cut before it",
            setup: |v| {
                let mut torn = bytes(1);
                v.meta(&v.rbw, 1, &torn);
                torn[100] ^= 0xff;
                v.block(&v.rbw, &torn);
            },
            expect: Some((Rwr, 1, 0)),
            left: RBW_PAIR,
            corrupt: 0,
        },
        Case {
            name: "rbw replica after an hflush mid-chunk: the partial chunk's prefix is kept",
            setup: |v| {
                let data = bytes(1);
                v.meta(&v.rbw, 1, &data[..700]);
                v.block(&v.rbw, &data);
            },
            expect: Some((Rwr, 1, 700)),
            left: RBW_PAIR,
            corrupt: 0,
        },
        Case {
            name: "rbw meta without its header (created, power cut before any hsync)",
            setup: |v| {
                v.block(&v.rbw, &bytes(1));
                std::fs::write(v.rbw.join("blk_513_1.meta"), b"").unwrap();
            },
            expect: None,
            left: &[],
            corrupt: 0,
        },
        Case {
            name: "names that are not replica files are left alone",
            setup: |v| {
                v.pair(&v.rbw, 1, &bytes(1));
                std::fs::write(v.rbw.join("blk_513.tmp"), b"x").unwrap();
            },
            expect: Some((Rwr, 1, FULL)),
            left: &["rbw/blk_513", "rbw/blk_513.tmp", "rbw/blk_513_1.meta"],
            corrupt: 0,
        },
    ]
}

fn run(case: &Case) {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().to_path_buf()];
    drop(Dataset::open(&dirs, Arc::new(Metrics::default())).unwrap());
    let v = Vol {
        rbw: layout::rbw_dir(root.path()),
        fin: layout::finalized_subdir(root.path(), ID),
    };
    std::fs::create_dir_all(&v.fin).unwrap();
    (case.setup)(&v);
    let m = Arc::new(Metrics::default());
    let ds = Dataset::open(&dirs, m.clone()).unwrap();
    let got = ds
        .get(ID)
        .map(|e| (e.state, e.gen_stamp.0, e.live.bytes_on_disk()));
    assert_eq!(got, case.expect, "{}: replica", case.name);
    assert_eq!(v.files(), case.left, "{}: files left", case.name);
    assert_eq!(
        m.corrupt_replicas_skipped.get(),
        case.corrupt,
        "{}: corrupt count",
        case.name
    );
    if let Some(e) = ds.get(ID) {
        let want = if e.state == Finalized { &v.fin } else { &v.rbw };
        assert_eq!(&e.dir, want, "{}: directory", case.name);
    }
}

#[test]
fn every_combination_of_rbw_and_finalized_files_has_its_outcome() {
    for case in cases() {
        run(&case);
    }
}

#[test]
fn a_second_scan_of_the_result_changes_nothing() {
    for case in cases() {
        let root = tempfile::tempdir().unwrap();
        let dirs = vec![root.path().to_path_buf()];
        drop(Dataset::open(&dirs, Arc::new(Metrics::default())).unwrap());
        let v = Vol {
            rbw: layout::rbw_dir(root.path()),
            fin: layout::finalized_subdir(root.path(), ID),
        };
        std::fs::create_dir_all(&v.fin).unwrap();
        (case.setup)(&v);
        drop(Dataset::open(&dirs, Arc::new(Metrics::default())).unwrap());
        let first = v.files();
        let ds = Dataset::open(&dirs, Arc::new(Metrics::default())).unwrap();
        assert_eq!(v.files(), first, "{}: files", case.name);
        let got = ds.get(ID).map(|e| (e.state, e.gen_stamp.0));
        assert_eq!(
            got,
            case.expect.map(|(s, g, _)| (s, g)),
            "{}: replica",
            case.name
        );
    }
}

#[test]
fn a_roll_forward_syncs_the_destination_then_the_source() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().to_path_buf()];
    drop(Dataset::open(&dirs, Arc::new(Metrics::default())).unwrap());
    let v = Vol {
        rbw: layout::rbw_dir(root.path()),
        fin: layout::finalized_subdir(root.path(), ID),
    };
    std::fs::create_dir_all(&v.fin).unwrap();
    v.pair(&v.rbw, 1, &bytes(1));
    v.mv(&v.rbw, &v.fin, "blk_513_1.meta");
    crate::sys::record::take();
    drop(Dataset::open(&dirs, Arc::new(Metrics::default())).unwrap());
    let synced = crate::sys::record::take();
    let (f, r) = (
        synced.iter().position(|d| d == &v.fin),
        synced.iter().position(|d| d == &v.rbw),
    );
    assert!(matches!((f, r), (Some(f), Some(r)) if f < r), "{synced:?}");
}
