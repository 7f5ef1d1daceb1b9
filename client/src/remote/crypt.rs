//! Snapshot blobs encrypted for registries with age (X25519 recipients): a recipient is an
//! `age1…` public key, a key file holds `AGE-SECRET-KEY-1…` identities. age seals its payload
//! in authenticated 64 KiB chunks, so a tampered blob fails to decrypt; the plain bytes are
//! also checked against their digest.

use std::{
    fs,
    io::{self, BufReader, Read, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::Path,
};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// Who an encrypted snapshot is for.
pub struct Recipients(Vec<age::x25519::Recipient>);

impl Recipients {
    /// Each of `args` (`--encrypt-to`): an `age1…` public key, or a file of them, one per line
    /// (`#` comments), as `age -R` reads.
    pub fn parse(args: &[String]) -> Result<Recipients> {
        let mut all = Vec::new();
        for arg in args {
            if arg.starts_with("age1") {
                all.push(one(arg, "--encrypt-to")?);
                continue;
            }
            let text = fs::read_to_string(arg).map_err(|e| {
                Error::from(format!(
                    "--encrypt-to {arg:?} is neither an age public key (age1…) nor a readable \
                     file of them: {e}"
                ))
            })?;
            let before = all.len();
            for line in text.lines().map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    all.push(one(line, arg)?);
                }
            }
            if all.len() == before {
                return Err(format!("--encrypt-to {arg}: the file names no recipient").into());
            }
        }
        Ok(Recipients(all))
    }

    /// Who these are, as one digest (the same set in any order gives the same): what a
    /// piece encrypted for them may be reused for.
    pub fn fingerprint(&self) -> String {
        let mut keys: Vec<String> = self.0.iter().map(|r| r.to_string()).collect();
        keys.sort();
        keys.dedup();
        chalk_runtime::snapshot::oci::sha256_digest(keys.join("\n").as_bytes())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn encryptor(&self) -> Result<age::Encryptor> {
        age::Encryptor::with_recipients(self.0.iter().map(|r| r as &dyn age::Recipient))
            .map_err(|e| Error::from(format!("encrypt: {e}")))
    }
}

fn one(text: &str, from: &str) -> Result<age::x25519::Recipient> {
    text.parse().map_err(|e| {
        Error::from(format!(
            "{from}: {text:?} is not an age X25519 recipient ({e}); `chalkctl snapshot keygen` \
             prints one"
        ))
    })
}

/// The identities a host decrypts with, from a key file only its owner may read.
pub struct Keys {
    identities: Vec<Box<dyn age::Identity + Send + Sync>>,
    path: String,
}

impl Keys {
    pub fn load(path: &Path) -> Result<Keys> {
        let shown = path.display().to_string();
        owner_only(path, "[encryption] identities")?;
        let file = age::IdentityFile::from_file(shown.clone())
            .map_err(|e| Error::from(format!("[encryption] identities {shown}: {e}")))?;
        let identities = file
            .into_identities()
            .map_err(|e| Error::from(format!("[encryption] identities {shown}: {e}")))?;
        if identities.is_empty() {
            return Err(format!("[encryption] identities {shown} holds no age identity").into());
        }
        Ok(Keys {
            identities,
            path: shown,
        })
    }

    fn open<R: Read>(&self, input: R) -> Result<impl Read> {
        let d = age::Decryptor::new(input).map_err(|e| self.explain(e))?;
        d.decrypt(
            self.identities
                .iter()
                .map(|i| i.as_ref() as &dyn age::Identity),
        )
        .map_err(|e| self.explain(e))
    }

    fn explain(&self, e: age::DecryptError) -> Error {
        match e {
            age::DecryptError::NoMatchingKeys => format!(
                "no key in {} opens it: it was encrypted for other recipients",
                self.path
            )
            .into(),
            e => format!("decrypt: {e}").into(),
        }
    }
}

/// Refuses a secret key file that anyone but its owner may read or write.
pub fn owner_only(path: &Path, what: &str) -> Result<()> {
    let meta =
        fs::metadata(path).map_err(|e| Error::from(format!("{what} {}: {e}", path.display())))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{what} {} is readable by others (mode {:o}): chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        )
        .into());
    }
    Ok(())
}

/// Encrypts `data` for `to`.
pub fn encrypt_bytes(to: &Recipients, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() + 256);
    let mut w = to
        .encryptor()?
        .wrap_output(&mut out)
        .map_err(|e| Error::from(format!("encrypt: {e}")))?;
    w.write_all(data)
        .and_then(|_| w.finish().map(drop))
        .map_err(|e| Error::from(format!("encrypt: {e}")))?;
    Ok(out)
}

/// Encrypts file `input` for `to` into `output` (a new file, 0600): its digest and size.
pub fn encrypt_file(to: &Recipients, input: &Path, output: &Path) -> Result<(String, u64)> {
    let fail = |e: io::Error| Error::from(format!("encrypt {}: {e}", input.display()));
    let mut src = fs::File::open(input).map_err(fail)?;
    let mut hashed = Hashed::create(output).map_err(fail)?;
    let mut w = to.encryptor()?.wrap_output(&mut hashed).map_err(fail)?;
    io::copy(&mut src, &mut w).map_err(fail)?;
    w.finish().map_err(fail)?;
    hashed.finish().map_err(fail)
}

/// Decrypts `data` (whose integrity age checks, and its digest in a manifest pins).
pub fn decrypt_any(keys: &Keys, data: &[u8]) -> Result<Vec<u8>> {
    let mut plain = Vec::new();
    keys.open(data)?
        .read_to_end(&mut plain)
        .map_err(|e| Error::from(format!("decrypt: {e}")))?;
    Ok(plain)
}

/// Decrypts `data`, checked against `digest` (the plain bytes').
pub fn decrypt_bytes(keys: &Keys, data: &[u8], digest: &str) -> Result<Vec<u8>> {
    let plain = decrypt_any(keys, data)?;
    let got = format!("sha256:{:x}", Sha256::digest(&plain));
    if got != digest {
        return Err(format!("decrypted {digest}, but it reads as {got}: refused").into());
    }
    Ok(plain)
}

/// Decrypts the encrypted blob `fill` writes (as it arrives from a registry) into `output`
/// (a new file, 0600) on another thread, checked against `digest`; a failure leaves no
/// `output`. The blob's own digest is `fill`'s to check.
pub fn decrypt_stream(
    keys: &Keys,
    output: &Path,
    digest: &str,
    fill: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<u64> {
    let (reader, mut writer) =
        io::pipe().map_err(|e| Error::from(format!("decrypt {digest}: a pipe: {e}")))?;
    let (filled, decrypted) = std::thread::scope(|scope| {
        let decrypting = scope.spawn(|| {
            let fail = |e: io::Error| Error::from(format!("decrypt {digest}: {e}"));
            let mut plain = keys.open(BufReader::with_capacity(1 << 20, reader))?;
            let mut hashed = Hashed::create(output).map_err(fail)?;
            io::copy(&mut plain, &mut hashed).map_err(fail)?;
            let (got, size) = hashed.finish().map_err(fail)?;
            if got != digest {
                return Err(format!("decrypted {digest}, but it reads as {got}: refused").into());
            }
            Ok(size)
        });
        let filled = fill(&mut writer);
        // The decryption sees the end (or a broken blob) once the writer is gone.
        drop(writer);
        let decrypted = decrypting.join().unwrap_or_else(|_| {
            Err(Error::from(format!(
                "decrypt {digest}: the thread panicked"
            )))
        });
        (filled, decrypted)
    });
    // A decryption that failed broke the pipe under the fetch: its error says why.
    let result = match (filled, decrypted) {
        (_, Err(e)) => Err(e),
        (Err(e), _) => Err(e),
        (Ok(()), Ok(size)) => Ok(size),
    };
    if result.is_err() {
        let _ = fs::remove_file(output);
    }
    result
}

/// A new identity in `out` (0600, never over an existing file): its recipient.
pub fn generate(out: &Path) -> Result<String> {
    use age::secrecy::ExposeSecret;
    let id = age::x25519::Identity::generate();
    let recipient = id.to_public().to_string();
    let text = format!(
        "# chalk-shim snapshot key; its recipient (for --encrypt-to): {recipient}\n{}\n",
        id.to_string().expose_secret()
    );
    write_secret(out, text.as_bytes())?;
    Ok(recipient)
}

/// A new file only its owner may read (never an existing one).
fn create_private(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Writes a new owner-only file.
pub fn write_secret(out: &Path, data: &[u8]) -> Result<()> {
    let mut f = create_private(out).map_err(|e| {
        Error::from(format!(
            "{}: {e} (keys are never overwritten)",
            out.display()
        ))
    })?;
    f.write_all(data)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::from(format!("{}: {e}", out.display())))
}

/// A writer that hashes and counts what passes through it.
struct Hashed<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl Hashed<io::BufWriter<fs::File>> {
    /// Into a new owner-only file at `path`.
    fn create(path: &Path) -> io::Result<Self> {
        Ok(Hashed {
            inner: io::BufWriter::with_capacity(1 << 20, create_private(path)?),
            hash: Sha256::new(),
            size: 0,
        })
    }

    /// Flushed: the digest and size of what was written.
    fn finish(mut self) -> io::Result<(String, u64)> {
        self.inner.flush()?;
        Ok((format!("sha256:{:x}", self.hash.finalize()), self.size))
    }
}

impl<W: Write> Write for Hashed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key(dir: &Path) -> (Keys, Recipients) {
        let path = dir.join("key");
        let r = generate(&path).unwrap();
        (Keys::load(&path).unwrap(), Recipients::parse(&[r]).unwrap())
    }

    #[test]
    fn files_and_bytes_come_back_only_with_the_key_and_their_digest() {
        let dir = tempfile::tempdir().unwrap();
        let (keys, to) = key(dir.path());
        let data = b"marker-0123 in memory".repeat(10_000);
        let plain = dir.path().join("plain");
        fs::write(&plain, &data).unwrap();
        let sealed = dir.path().join("sealed");
        let (digest, size) = encrypt_file(&to, &plain, &sealed).unwrap();
        let bytes = fs::read(&sealed).unwrap();
        assert_eq!(size, bytes.len() as u64);
        assert_eq!(digest, format!("sha256:{:x}", Sha256::digest(&bytes)));
        assert!(!bytes.windows(11).any(|w| w == b"marker-0123"));
        assert_eq!(fs::metadata(&sealed).unwrap().mode() & 0o777, 0o600);
        let want = format!("sha256:{:x}", Sha256::digest(&data));
        let whole = |w: &mut dyn Write| w.write_all(&bytes).map_err(|e| Error::from(e.to_string()));
        let back = dir.path().join("back");
        decrypt_stream(&keys, &back, &want, whole).unwrap();
        assert_eq!(fs::read(&back).unwrap(), data);
        // The wrong digest leaves nothing.
        let again = dir.path().join("again");
        let e = decrypt_stream(&keys, &again, "sha256:00", whole).unwrap_err();
        assert!(e.to_string().contains("refused") && !again.exists(), "{e}");
        // Streamed in small writes, as a fetch writes it.
        let streamed = dir.path().join("streamed");
        decrypt_stream(&keys, &streamed, &want, |w| {
            for piece in bytes.chunks(1000) {
                w.write_all(piece).map_err(|e| Error::from(e.to_string()))?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(fs::read(&streamed).unwrap(), data);
        let cut = dir.path().join("cut");
        let e = decrypt_stream(&keys, &cut, &want, |w| {
            w.write_all(&bytes[..bytes.len() / 2])
                .map_err(|e| Error::from(e.to_string()))
        })
        .unwrap_err();
        assert!(!cut.exists(), "{e}");
        let small = encrypt_bytes(&to, b"{}").unwrap();
        let d = format!("sha256:{:x}", Sha256::digest(b"{}"));
        assert_eq!(decrypt_bytes(&keys, &small, &d).unwrap(), b"{}");
    }

    #[test]
    fn other_keys_and_tampered_blobs_are_refused() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let (_, to_a) = key(a.path());
        let (keys_b, _) = key(b.path());
        let blob = encrypt_bytes(&to_a, b"secret").unwrap();
        let d = format!("sha256:{:x}", Sha256::digest(b"secret"));
        let e = decrypt_bytes(&keys_b, &blob, &d).unwrap_err().to_string();
        assert!(e.contains("encrypted for other recipients"), "{e}");
        let keys_a = Keys::load(&a.path().join("key")).unwrap();
        let mut bad = blob.clone();
        let last = bad.len() - 3;
        bad[last] ^= 1;
        assert!(decrypt_bytes(&keys_a, &bad, &d).is_err());
    }

    #[test]
    fn bad_input_keys_and_recipients_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        generate(&path).unwrap();
        let e = generate(&path).unwrap_err().to_string();
        assert!(e.contains("never overwritten"), "{e}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keys::load(&path).err().unwrap().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        let e = Recipients::parse(&["age1nope".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not an age X25519 recipient"), "{e}");
        let e = Recipients::parse(&["/no/such".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("neither an age public key"), "{e}");
        let list = dir.path().join("recipients");
        fs::write(&list, "# none\n").unwrap();
        let e = Recipients::parse(&[list.display().to_string()])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("names no recipient"), "{e}");
    }
}
