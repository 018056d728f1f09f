//! What a file was given since its last fsync: written ranges and size changes, in memory.
//!
//! The backing file holds the file as it was at its last `fsync`/`fdatasync`; [`Pending`]
//! holds everything after, so a read sees both (page-cache semantics) and a crash drops it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Unsynced changes of one file.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The file's size as readers see it.
    size: u64,
    /// How many bytes of the backing file are still the file's (the smallest size it was
    /// truncated to since the last sync).
    keep: u64,
    /// Written ranges, by offset, never overlapping.
    extents: BTreeMap<u64, Vec<u8>>,
}

impl Pending {
    /// No change yet over a backing file of `durable_len` bytes.
    pub(super) fn new(durable_len: u64) -> Pending {
        Pending {
            size: durable_len,
            keep: durable_len,
            extents: BTreeMap::new(),
        }
    }

    /// The size readers see.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// Bytes held in memory.
    pub(super) fn bytes(&self) -> u64 {
        self.extents.values().map(|v| v.len() as u64).sum()
    }

    /// Records a write of `data` at `off`.
    pub(super) fn write(&mut self, off: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = off + data.len() as u64;
        self.cut(off, end);
        self.extents.insert(off, data.to_vec());
        self.size = self.size.max(end);
    }

    /// Removes `[off, end)` from the extents, keeping the parts of extents outside it.
    fn cut(&mut self, off: u64, end: u64) {
        if let Some((&s, v)) = self.extents.range(..off).next_back() {
            let e = s + v.len() as u64;
            if e > off {
                let v = self.extents.remove(&s).unwrap_or_default();
                if e > end {
                    self.extents.insert(end, v[(end - s) as usize..].to_vec());
                }
                self.extents.insert(s, v[..(off - s) as usize].to_vec());
            }
        }
        let inside: Vec<u64> = self.extents.range(off..end).map(|(k, _)| *k).collect();
        for s in inside {
            let v = self.extents.remove(&s).unwrap_or_default();
            let e = s + v.len() as u64;
            if e > end {
                self.extents.insert(end, v[(end - s) as usize..].to_vec());
            }
        }
    }

    /// Records a truncate (or extension with zeros) to `size`.
    pub(super) fn truncate(&mut self, size: u64) {
        self.cut(size, u64::MAX);
        self.keep = self.keep.min(size);
        self.size = size;
    }

    /// Reads `len` bytes at `off`: the backing file's kept bytes under the written ranges.
    pub(super) fn read(&self, backing: &File, off: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = off.saturating_add(len).min(self.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - off) as usize];
        let kept = self.keep.min(backing.metadata()?.len()).min(end);
        if off < kept {
            read_full(backing, &mut buf[..(kept - off) as usize], off)?;
        }
        for (&s, v) in self.extents.range(..end).rev() {
            let e = s + v.len() as u64;
            if e <= off {
                break;
            }
            let (from, to) = (s.max(off), e.min(end));
            buf[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&v[(from - s) as usize..(to - s) as usize]);
        }
        Ok(buf)
    }

    /// Writes everything down to the backing file (an fsync).
    pub(super) fn apply(&self, backing: &File) -> io::Result<()> {
        if backing.metadata()?.len() > self.keep {
            backing.set_len(self.keep)?;
        }
        if self.size != self.keep {
            backing.set_len(self.size)?;
        }
        for (&off, v) in &self.extents {
            backing.write_all_at(v, off)?;
        }
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes at `off`, zero-filling past the backing file's end.
fn read_full(f: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], off + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, bytes).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        (dir, f)
    }

    #[test]
    fn overlapping_writes_read_back_in_order_and_apply_exactly() {
        let (_d, f) = backing(b"0123456789");
        let mut p = Pending::new(10);
        p.write(2, b"aaaa");
        p.write(4, b"bb");
        p.write(0, b"c");
        p.write(12, b"zz");
        let want = b"c1aabb6789\0\0zz".to_vec();
        assert_eq!(p.read(&f, 0, 100).unwrap(), want);
        assert_eq!(p.read(&f, 3, 4).unwrap(), want[3..7].to_vec());
        p.apply(&f).unwrap();
        let mut all = vec![0u8; 14];
        read_full(&f, &mut all, 0).unwrap();
        assert_eq!(all, want);
    }

    #[test]
    fn truncate_then_grow_reads_zeros_over_the_old_bytes() {
        let (_d, f) = backing(b"0123456789");
        let mut p = Pending::new(10);
        p.write(6, b"xyz");
        p.truncate(4);
        p.truncate(8);
        assert_eq!(p.read(&f, 0, 100).unwrap(), b"0123\0\0\0\0".to_vec());
        p.apply(&f).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 8);
        let mut all = vec![1u8; 8];
        read_full(&f, &mut all, 0).unwrap();
        assert_eq!(all, b"0123\0\0\0\0".to_vec());
    }
}
