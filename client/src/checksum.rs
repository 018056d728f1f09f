//! File checksums ([`FileSystem::file_checksum`]): `COMPOSITE-CRC32C` as HDFS defines it,
//! the CRC32C of the whole contents, so equal contents give equal checksums whatever the block
//! size or the replicas read. Each block's CRC is computed from its bytes as read (every
//! chunk checked against the CRC stored beside it on the way) and the block CRCs are
//! combined in file order (`crc32c_combine`). WebHDFS `GETFILECHECKSUM` and `sluice checksum`
//! both answer with it.

use crate::error::ClientError;
use crate::filesystem::FileSystem;

/// HDFS's name of the algorithm (`dfs.checksum.combine.mode=COMPOSITE_CRC`, CRC32C).
pub const COMPOSITE_CRC32C: &str = "COMPOSITE-CRC32C";

/// Bytes read per step.
const PIECE: usize = 256 * 1024;

/// A file's checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileChecksum {
    /// The CRC32C of the contents.
    pub crc: u32,
    /// The bytes it covers (the file's length).
    pub length: u64,
}

impl FileChecksum {
    /// The algorithm's name, [`COMPOSITE_CRC32C`].
    pub fn algorithm(&self) -> &'static str {
        COMPOSITE_CRC32C
    }

    /// The checksum's bytes: the CRC, big-endian (as HDFS writes it).
    pub fn bytes(&self) -> [u8; 4] {
        self.crc.to_be_bytes()
    }

    /// The bytes in lower-case hex.
    pub fn hex(&self) -> String {
        self.bytes().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl FileSystem {
    /// The `COMPOSITE-CRC32C` checksum of the file at `path` (see the module docs).
    pub async fn file_checksum(&self, path: &str) -> Result<FileChecksum, ClientError> {
        let r = self.open(path).await?;
        let len = r.len();
        let mut crc = 0u32;
        let mut buf = vec![0u8; PIECE];
        for b in r.blocks().to_vec() {
            let end = (b.offset + b.block.num_bytes).min(len);
            let mut block_crc = 0u32;
            let mut pos = b.offset;
            while pos < end {
                let want = ((end - pos) as usize).min(PIECE);
                let n = r.read_at(pos, &mut buf[..want]).await?;
                if n == 0 {
                    return Err(ClientError::protocol(
                        "file checksum",
                        format!("{path} ended at {pos}, before its length {len}"),
                    ));
                }
                block_crc = crc32c::crc32c_append(block_crc, &buf[..n]);
                pos += n as u64;
            }
            crc = crc32c::crc32c_combine(crc, block_crc, (end - b.offset.min(end)) as usize);
        }
        Ok(FileChecksum { crc, length: len })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn combined_block_crcs_equal_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole = crc32c::crc32c(&data);
        for block in [512usize, 4096, 9999, 10_000] {
            let mut crc = 0u32;
            for part in data.chunks(block) {
                crc = crc32c::crc32c_combine(crc, crc32c::crc32c(part), part.len());
            }
            assert_eq!(crc, whole, "block size {block}");
        }
    }
}
