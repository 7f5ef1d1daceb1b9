//! A packed snapshot's memory file put together from its pieces: each pack's pieces fetched
//! by range, in runs, each opened (decrypted where it is sealed), decompressed into at most
//! its length and checked against its digest before its bytes are written where the index
//! puts them; what no extent covers stays a hole of zeros. The whole file is then hashed
//! against the snapshot's own digest of it before the store may name it by that digest.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::Path,
};

use chalk_runtime::snapshot::memory::{
    index::{Extent, PieceRef},
    pack,
    pages::{PageDigest, PAGE, ZERO},
    MemoryIndex, PageTable,
};
use chalk_runtime::snapshot::{hash, store::Store};
use oci_client::Reference;

use super::super::{crypt, session::Session};
use crate::{Error, Result};

/// The most bytes one ranged fetch asks for.
const RUN_BYTES: u64 = 16 << 20;

/// Pieces of one pack fetched in one request: indices into the index's pieces.
pub struct Run {
    pack: usize,
    offset: u64,
    len: u64,
    pieces: Vec<usize>,
}

impl Run {
    /// The pack's index in the memory index's packs.
    pub fn pack(&self) -> usize {
        self.pack
    }

    /// Its pieces (indices into the index's pieces), in the pack's order.
    pub fn pieces(&self) -> &[usize] {
        &self.pieces
    }
}

/// Pieces `wanted` (indices into the index's pieces) gathered into runs: consecutive pieces
/// of a pack, in the pack's order, at most [`RUN_BYTES`] a run; pieces that lie apart start
/// a new run.
pub fn runs(index: &MemoryIndex, wanted: impl IntoIterator<Item = usize>) -> Vec<Run> {
    let mut order: Vec<usize> = wanted.into_iter().collect();
    order.sort_by_key(|i| (index.pieces[*i].pack, index.pieces[*i].offset));
    order.dedup();
    let mut out: Vec<Run> = Vec::new();
    for i in order {
        let p = &index.pieces[i];
        match out.last_mut() {
            Some(r)
                if r.pack == p.pack as usize
                    && r.offset + r.len == p.offset
                    && r.len + p.stored <= RUN_BYTES =>
            {
                r.len += p.stored;
                r.pieces.push(i);
            }
            _ => out.push(Run {
                pack: p.pack as usize,
                offset: p.offset,
                len: p.stored,
                pieces: vec![i],
            }),
        }
    }
    out
}

/// A pack this host kept when it pushed it.
#[derive(Clone, Copy)]
pub struct Kept<'a> {
    pub path: &'a Path,
    /// The host vouches for the index (`Store::catalog_vouches`): the pack's pieces are read
    /// unhashed, and come with no page digests.
    pub vouched: bool,
}

/// Fetches `run` in one ranged request and hands each of its pieces, opened (decrypted with
/// `keys` where sealed) and checked, to `each` with its page digests, as it completes. Read
/// from `kept` instead, where this host kept the pack, unless a piece there does not check.
pub fn fetch_run(
    s: &Session,
    r: &Reference,
    index: &MemoryIndex,
    run: &Run,
    keys: Option<&crypt::Keys>,
    kept: Option<Kept<'_>>,
    mut each: impl FnMut(usize, Vec<u8>, Vec<PageDigest>) -> Result<()>,
) -> Result<()> {
    if let Some(opened) = kept.and_then(|k| read_kept(k, index, run, keys)) {
        for (i, bytes, pages) in opened {
            each(i, bytes, pages)?;
        }
        return Ok(());
    }
    let mut next = run.pieces.iter().peekable();
    let mut buf: Vec<u8> = Vec::new();
    s.blob_range(
        r,
        &index.packs[run.pack],
        run.offset,
        run.len,
        |mut bytes| {
            while !bytes.is_empty() {
                let Some(&&i) = next.peek() else {
                    return Err(Error::from("the registry sent more than the range asked"));
                };
                let piece = &index.pieces[i];
                let take = (piece.stored as usize - buf.len()).min(bytes.len());
                buf.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if buf.len() as u64 == piece.stored {
                    let (bytes, pages) = open(piece, &buf, keys)?;
                    each(i, bytes, pages)?;
                    buf.clear();
                    next.next();
                }
            }
            Ok(())
        },
    )?;
    if next.peek().is_some() {
        return Err(Error::from(format!(
            "pack {} ended before its pieces did",
            index.packs[run.pack]
        )));
    }
    Ok(())
}

/// A piece opened: its index, bytes and page digests.
type Opened = (usize, Vec<u8>, Vec<PageDigest>);

/// The pieces of `run` from the kept pack, each checked unless vouched for; None if any is
/// not there or does not check (then the registry's are fetched).
fn read_kept(
    kept: Kept<'_>,
    index: &MemoryIndex,
    run: &Run,
    keys: Option<&crypt::Keys>,
) -> Option<Vec<Opened>> {
    let file = File::open(kept.path).ok()?;
    let mut bytes = vec![0u8; run.len as usize];
    file.read_exact_at(&mut bytes, run.offset).ok()?;
    let mut at = 0usize;
    run.pieces
        .iter()
        .map(|&i| {
            let piece = &index.pieces[i];
            let stored = bytes.get(at..at + piece.stored as usize)?;
            at += piece.stored as usize;
            if kept.vouched {
                let b = opened(stored, keys).ok()?;
                return Some((i, pack::decompress(&b, piece).ok()?, Vec::new()));
            }
            let (b, p) = open(piece, stored, keys).ok()?;
            Some((i, b, p))
        })
        .collect()
}

/// A piece from what its pack holds: decrypted where sealed, decompressed and checked.
fn open(
    piece: &PieceRef,
    stored: &[u8],
    keys: Option<&crypt::Keys>,
) -> Result<(Vec<u8>, Vec<PageDigest>)> {
    pack::open(&opened(stored, keys)?, piece).map_err(Error::from)
}

/// The zstd frame of what a pack holds for a piece: decrypted where sealed.
fn opened<'a>(stored: &'a [u8], keys: Option<&crypt::Keys>) -> Result<std::borrow::Cow<'a, [u8]>> {
    Ok(match keys {
        Some(keys) => std::borrow::Cow::Owned(crypt::decrypt_any(keys, stored)?),
        None => std::borrow::Cow::Borrowed(stored),
    })
}

/// Writes the memory file `index` describes to `part` (a new file, root-only) from the packs
/// of `r` (or those `store` kept), and checks it hashes to `digest`; its page digests, for
/// the next push from here.
pub fn fetch(
    s: &Session,
    r: &Reference,
    store: &Store,
    index: &MemoryIndex,
    keys: Option<&crypt::Keys>,
    digest: &str,
    part: &Path,
) -> Result<PageTable> {
    let written = (|| {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(part)
            .map_err(|e| Error::from(format!("{}: {e}", part.display())))?;
        file.set_len(index.size)
            .map_err(|e| Error::from(format!("{}: {e}", part.display())))?;
        let uses = index.extents_by_piece();
        let mut pages = PageTable {
            size: index.size,
            pages: vec![ZERO; PageTable::count_for(index.size) as usize],
        };
        for run in runs(index, 0..index.pieces.len()) {
            let kept = store.kept_pack(&index.packs[run.pack()]);
            fetch_run(
                s,
                r,
                index,
                &run,
                keys,
                kept.as_deref().map(|path| Kept {
                    path,
                    vouched: false,
                }),
                |i, bytes, digests| place(&bytes, &digests, &file, &uses[i], &mut pages),
            )?;
        }
        check_whole(part, digest)?;
        Ok(pages)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(part);
    }
    written
}

/// Writes each extent that takes from a piece of `bytes` (with page digests `digests`).
fn place(
    bytes: &[u8],
    digests: &[PageDigest],
    file: &File,
    extents: &[Extent],
    pages: &mut PageTable,
) -> Result<()> {
    for e in extents {
        let slice = &bytes[e.at as usize..(e.at + e.len) as usize];
        file.write_all_at(slice, e.offset)
            .map_err(|err| Error::from(format!("write the memory file: {err}")))?;
    }
    place_digests(digests, extents, pages);
    Ok(())
}

/// Records where a piece's page digests `digests` land in the file, by its `extents`.
pub fn place_digests(digests: &[PageDigest], extents: &[Extent], pages: &mut PageTable) {
    for e in extents {
        if e.offset.is_multiple_of(PAGE) && e.at.is_multiple_of(PAGE) {
            for k in 0..e.len.div_ceil(PAGE) {
                let (to, from) = ((e.offset / PAGE + k) as usize, (e.at / PAGE + k) as usize);
                if let (Some(slot), Some(d)) = (pages.pages.get_mut(to), digests.get(from)) {
                    *slot = *d;
                }
            }
        }
    }
}

/// Refuses the file unless it hashes to `digest`: every piece matched its index, so a
/// mismatch means the index and the snapshot's manifest disagree.
fn check_whole(path: &Path, digest: &str) -> Result<()> {
    let whole = hash::hash_files(&[path.to_path_buf()], 1)
        .map_err(|e| Error::from(format!("read back the memory file: {e}")))?;
    let got = format!("sha256:{}", whole[0].sha256);
    if got != digest {
        return Err(Error::from(format!(
            "the memory put together from its pieces hashes to {got}, not {digest}: every \
             piece matched the index, so the index and the snapshot's manifest disagree"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(pack: u32, offset: u64, stored: u64) -> PieceRef {
        PieceRef {
            digest: "ab".repeat(32),
            len: PAGE,
            pack,
            offset,
            stored,
        }
    }

    #[test]
    fn adjacent_pieces_of_a_pack_come_in_one_run() {
        let index = MemoryIndex {
            size: 0,
            depth: 1,
            packs: vec![String::new(), String::new()],
            pieces: vec![
                piece(1, 0, 10),
                piece(0, 50, 5),
                piece(1, 10, 10),
                piece(0, 0, 50),
                piece(1, 30, 1),
            ],
            extents: Vec::new(),
        };
        let got: Vec<(usize, u64, u64, Vec<usize>)> = runs(&index, [4, 3, 2, 1, 0, 1])
            .into_iter()
            .map(|r| (r.pack, r.offset, r.len, r.pieces))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 55, vec![3, 1]),
                (1, 0, 20, vec![0, 2]),
                (1, 30, 1, vec![4])
            ]
        );
    }
}
