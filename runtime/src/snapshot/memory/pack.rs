//! Packs: the blobs that hold pieces in a registry. A pack is its pieces one after another,
//! each a zstd frame of its own (level 1, as E2B stores memory), so any one piece can be
//! fetched by range and checked without the rest. In an encrypted snapshot each frame is also
//! an age file of its own: a piece stays fetchable and readable alone, and a later snapshot
//! for the same recipients refers to it without sending it again.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::Path,
    sync::Mutex,
};

use sha2::{Digest, Sha256};

use super::{
    index::PieceRef,
    pages::{digest_piece, PageDigest},
    plan::NewPiece,
};
use crate::{Error, Result};

/// A pack of plain zstd frames.
pub const MEDIA_TYPE: &str = "application/vnd.chalk.memory.pack.v1";
/// A pack whose frames are each encrypted with age.
pub const SEALED_MEDIA_TYPE: &str = "application/vnd.chalk.memory.pack.sealed.v1";
/// zstd's fastest level: memory compresses well at it and a push is not held up.
const LEVEL: i32 = 1;
/// Pieces compressed at once per worker before they are written in order.
const BATCH_PER_WORKER: usize = 4;

/// What sealing a compressed frame does (encryption, or nothing).
pub type SealFn<'a> = &'a (dyn Fn(Vec<u8>) -> std::result::Result<Vec<u8>, String> + Sync);

/// A pack written: its digest and size, and where each piece went in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub digest: String,
    pub size: u64,
    /// `(offset, stored)` of each piece, in order.
    pub places: Vec<(u64, u64)>,
}

/// Writes the pieces `new` of the memory file at `source` as a pack at `out` (a new file,
/// root-only), compressing on `threads` workers.
pub fn write(
    source: &Path,
    new: &[NewPiece],
    out: &Path,
    seal: SealFn,
    threads: usize,
) -> Result<Written> {
    let file =
        File::open(source).map_err(|e| Error::io(format!("open {}", source.display()), e))?;
    let mut pack = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| Error::io(format!("create {}", out.display()), e))?;
    let workers = super::super::hash::workers(threads, new.len());
    let mut hash = Sha256::new();
    let mut places = Vec::with_capacity(new.len());
    let mut offset = 0;
    for batch in new.chunks(workers * BATCH_PER_WORKER) {
        let frames: Vec<Mutex<Vec<u8>>> = batch.iter().map(|_| Mutex::new(Vec::new())).collect();
        super::super::hash::in_parallel(workers, batch.len(), |i, _| {
            let bytes = read_piece(&file, &batch[i], source)?;
            let frame = zstd::bulk::compress(&bytes, LEVEL)
                .map_err(|e| Error::io("compress a piece of memory".to_string(), e))?;
            let frame = seal(frame).map_err(|e| Error::Snapshot {
                dir: out.to_path_buf(),
                message: format!("seal a piece: {e}"),
            })?;
            *frames[i].lock().unwrap() = frame;
            Ok(())
        })?;
        for frame in frames {
            let frame = frame.into_inner().unwrap();
            pack.write_all(&frame)
                .map_err(|e| Error::io(format!("write {}", out.display()), e))?;
            hash.update(&frame);
            places.push((offset, frame.len() as u64));
            offset += frame.len() as u64;
        }
    }
    Ok(Written {
        digest: format!("sha256:{:x}", hash.finalize()),
        size: offset,
        places,
    })
}

fn read_piece(file: &File, piece: &NewPiece, source: &Path) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; piece.len as usize];
    let mut at = 0;
    for (offset, len) in &piece.runs {
        file.read_exact_at(&mut bytes[at..at + *len as usize], *offset)
            .map_err(|e| Error::io(format!("read {}", source.display()), e))?;
        at += *len as usize;
    }
    Ok(bytes)
}

/// A piece's bytes from what its pack holds for it, once opened (decrypted where sealed):
/// decompressed into at most its length and checked against its digest. Its page digests
/// come with it.
pub fn open(
    frame: &[u8],
    piece: &PieceRef,
) -> std::result::Result<(Vec<u8>, Vec<PageDigest>), String> {
    let bytes = decompress(frame, piece)?;
    let (digest, pages) = digest_piece(&bytes);
    if digest != piece.digest {
        return Err(format!(
            "piece {} does not match its digest (it hashes to {digest}): the pack was changed \
             or damaged",
            piece.digest
        ));
    }
    Ok((bytes, pages))
}

/// A piece's bytes, decompressed into at most its length but not hashed: only for a pack
/// this host wrote itself from memory it had hashed (see `Store::catalog_vouches`).
pub fn decompress(frame: &[u8], piece: &PieceRef) -> std::result::Result<Vec<u8>, String> {
    let bytes = zstd::bulk::decompress(frame, piece.len as usize)
        .map_err(|e| format!("piece {} does not decompress: {e}", piece.digest))?;
    if bytes.len() as u64 != piece.len {
        return Err(format!(
            "piece {} decompresses to {} bytes, the index says {}",
            piece.digest,
            bytes.len(),
            piece.len
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::memory::{
        index::MemoryIndex,
        pages::{PageTable, PAGE},
        plan::plan,
    };

    #[test]
    fn a_pack_holds_each_new_piece_compressed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("pages.img");
        let mut data = vec![0u8; (PAGE * 700) as usize];
        for (i, b) in data.iter_mut().enumerate() {
            // Mostly compressible, no two pages alike, page 3 all zeros.
            *b = if i % 64 == 0 {
                (i / 4096 % 251) as u8 + 1
            } else {
                0
            };
        }
        data[3 * PAGE as usize..4 * PAGE as usize].fill(0);
        std::fs::write(&source, &data).unwrap();
        let pt = PageTable::of_file(&source, 2).unwrap();
        let p = plan(&pt, None, 8);
        let out = dir.path().join("pack");
        let no_seal = |f: Vec<u8>| Ok(f);
        let w = write(&source, &p.new, &out, &no_seal, 2).unwrap();
        let packed = std::fs::read(&out).unwrap();
        assert_eq!(w.size, packed.len() as u64);
        assert_eq!(w.digest, crate::snapshot::oci::sha256_digest(&packed));
        assert!(w.size < data.len() as u64 / 10, "compressed: {}", w.size);
        let index: MemoryIndex = p.place(&w.digest, &w.places);
        index.check().unwrap();
        let mut rebuilt = vec![0u8; data.len()];
        for e in &index.extents {
            let piece = &index.pieces[e.piece as usize];
            let frame = &packed[piece.offset as usize..(piece.offset + piece.stored) as usize];
            let (bytes, _) = open(frame, piece).unwrap();
            rebuilt[e.offset as usize..e.end() as usize]
                .copy_from_slice(&bytes[e.at as usize..(e.at + e.len) as usize]);
        }
        assert!(rebuilt == data);
        // A frame changed in the registry is refused, naming the piece.
        let piece = &index.pieces[0];
        let mut frame = zstd::bulk::compress(&vec![7u8; piece.len as usize], 1).unwrap();
        assert!(open(&frame, piece).unwrap_err().contains("does not match"));
        frame.truncate(5);
        assert!(open(&frame, piece).unwrap_err().contains("decompress"));
    }
}
