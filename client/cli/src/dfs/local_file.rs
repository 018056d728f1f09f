//! Local files (and stdin, stdout) read and written on the blocking pool without a copy of
//! tokio's in between.
//!
//! `tokio::fs::File`, `tokio::io::stdout()` and `stdin()` copy every read or write through a
//! buffer of their own, filled or drained by a blocking thread: one more copy of every byte
//! (17 % of `sluice cat`'s samples, 4 % of `sluice put`'s). Here the buffer itself moves to
//! the blocking pool and back, and one read or write is in flight while the caller works on
//! the buffer before it:
//! - [`LocalSink`]: a received buffer (a `Bytes` from `FileReader::read_bytes`) is written by
//!   the blocking pool with one `write_all` while the next one is received (`get`, `cat`);
//! - [`LocalSource`]: the next buffer is read by the blocking pool while the caller writes the
//!   one it was given (`put`, `appendToFile`).

use bytes::Bytes;
use std::fs::File;
use std::io::{self, Read, Write};
use tokio::task::JoinHandle;

/// A read done on the blocking pool: the file, the buffer it filled, and how many bytes.
type Filled = (File, Vec<u8>, io::Result<usize>);

/// A local file (or stdin) read on the blocking pool, one buffer ahead of the caller.
pub(crate) struct LocalSource {
    /// What the last [`LocalSource::next`] returned.
    current: Vec<u8>,
    /// The read in flight: the file, the buffer it fills, and how many bytes it got. `None`
    /// once the end was reached or a read failed.
    pending: Option<JoinHandle<Filled>>,
    size: usize,
}

impl LocalSource {
    /// Reads `file` from its current position in reads of up to `size` bytes.
    pub(crate) fn new(file: File, size: usize) -> LocalSource {
        let mut s = LocalSource {
            current: Vec::new(),
            pending: None,
            size: size.max(1),
        };
        s.start(file, Vec::new());
        s
    }

    /// Reads this process's standard input (a duplicate of its descriptor).
    pub(crate) fn stdin(size: usize) -> io::Result<LocalSource> {
        use std::os::fd::AsFd;
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        Ok(LocalSource::new(File::from(fd), size))
    }

    fn start(&mut self, mut file: File, mut buf: Vec<u8>) {
        let size = self.size;
        self.pending = Some(tokio::task::spawn_blocking(move || {
            buf.resize(size, 0);
            let r = loop {
                match file.read(&mut buf) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            buf.truncate(*r.as_ref().unwrap_or(&0));
            (file, buf, r)
        }));
    }

    /// The next bytes of the file (at most the read size; fewer is not the end), empty at its
    /// end. The buffer returned before is reused for the read after this one.
    pub(crate) async fn next(&mut self) -> io::Result<&[u8]> {
        let Some(p) = self.pending.take() else {
            self.current.clear();
            return Ok(&self.current);
        };
        let (file, buf, r) = p.await.map_err(io::Error::other)?;
        let old = std::mem::replace(&mut self.current, buf);
        match r {
            Ok(0) => {}
            Ok(_) => self.start(file, old),
            Err(e) => return Err(e),
        }
        Ok(&self.current)
    }
}

/// A local file (or stdout) written on the blocking pool, one buffer in flight.
pub(crate) struct LocalSink {
    file: Option<File>,
    pending: Option<JoinHandle<(File, io::Result<()>)>>,
}

impl LocalSink {
    /// Writes to `file` from its current position.
    pub(crate) fn new(file: File) -> LocalSink {
        LocalSink {
            file: Some(file),
            pending: None,
        }
    }

    /// Writes to this process's standard output (a duplicate of its descriptor: writes go
    /// straight to it, past Rust's line buffer).
    pub(crate) fn stdout() -> io::Result<LocalSink> {
        use std::os::fd::AsFd;
        let fd = io::stdout().as_fd().try_clone_to_owned()?;
        Ok(LocalSink::new(File::from(fd)))
    }

    /// Waits until everything queued is written (not synced).
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        self.settle().await.map(|_| ())
    }

    /// Waits for the write in flight, if any, and returns the file.
    async fn settle(&mut self) -> io::Result<&mut File> {
        if let Some(p) = self.pending.take() {
            let (file, r) = p.await.map_err(io::Error::other)?;
            // After a failed write the file is dropped: nothing may be written past a gap.
            r?;
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| io::Error::other("an earlier write to the local file failed"))
    }

    /// Queues `data` to be written once the write before it has completed; an error of that
    /// earlier write is returned here.
    pub(crate) async fn write(&mut self, data: Bytes) -> io::Result<()> {
        self.settle().await?;
        let Some(mut file) = self.file.take() else {
            return Err(io::Error::other(
                "an earlier write to the local file failed",
            ));
        };
        self.pending = Some(tokio::task::spawn_blocking(move || {
            let r = file.write_all(&data);
            (file, r)
        }));
        Ok(())
    }

    /// Waits until everything queued is written; `sync` also makes it durable (`fsync`).
    pub(crate) async fn finish(mut self, sync: bool) -> io::Result<()> {
        let file = self.settle().await?;
        if !sync {
            return Ok(());
        }
        let file = file.try_clone()?;
        tokio::task::spawn_blocking(move || file.sync_all())
            .await
            .map_err(io::Error::other)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_source_hands_out_the_file_in_order_then_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in");
        let want: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &want).unwrap();
        let mut src = LocalSource::new(File::open(&path).unwrap(), 4096);
        let mut got = Vec::new();
        loop {
            let b = src.next().await.unwrap();
            if b.is_empty() {
                break;
            }
            assert!(b.len() <= 4096);
            got.extend_from_slice(b);
        }
        assert_eq!(got, want);
        assert!(src.next().await.unwrap().is_empty(), "stays at the end");
    }

    #[tokio::test]
    async fn a_failed_read_is_an_error_not_the_end() {
        // A directory opened as a file: read fails with EISDIR.
        let dir = tempfile::tempdir().unwrap();
        let mut src = LocalSource::new(File::open(dir.path()).unwrap(), 4096);
        let e = src.next().await.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{e}");
        assert!(src.next().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn buffers_are_written_in_order_and_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut sink = LocalSink::new(File::create(&path).unwrap());
        let mut want = Vec::new();
        for i in 0..50u8 {
            let piece = vec![i; 1000 + usize::from(i) * 37];
            want.extend_from_slice(&piece);
            sink.write(Bytes::from(piece)).await.unwrap();
        }
        sink.finish(true).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_by_the_next_call() {
        // A file opened read-only: the first write fails on the blocking pool, and the
        // caller hears of it at its next write or at the end.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        let mut sink = LocalSink::new(File::open(&path).unwrap());
        sink.write(Bytes::from_static(b"abc")).await.unwrap();
        let e = sink.write(Bytes::from_static(b"def")).await.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        let e = sink.finish(false).await.unwrap_err();
        assert!(e.to_string().contains("earlier write"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"x");
    }
}
