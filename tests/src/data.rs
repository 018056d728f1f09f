//! Whole-file write and read through the client.

use sluice_client::{FileSystem, WriteOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes `data` to `path` in writes of `write_size` bytes and closes the file.
pub async fn write_all(
    fs: &FileSystem,
    path: &str,
    data: &[u8],
    opts: WriteOptions,
    write_size: usize,
) -> anyhow::Result<()> {
    let mut w = fs.create(path, opts).await?;
    for piece in data.chunks(write_size.max(1)) {
        w.write_all(piece).await?;
    }
    w.close().await?;
    Ok(())
}

/// Reads the whole file.
pub async fn read_all(fs: &FileSystem, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut r = fs.open(path).await?;
    let mut out = Vec::new();
    r.read_to_end(&mut out).await?;
    Ok(out)
}
