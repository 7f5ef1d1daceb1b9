//! One registry endpoint, spoken to over the OCI distribution API (`oci-client`), with calls
//! that block: chalkctl is a command line, and its containerd client blocks too. Every blob
//! fetched is checked against its digest before anything uses it. A registry is a stranger:
//! its manifests are read with a cap, every call ends by the transfer's deadline when it has
//! one, and a body that trickles in slower than [`MIN_RATE`] is cut off.

mod explain;
mod raw;

use explain::not_found;

use std::{
    future::Future,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::Path,
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::StreamExt;
use oci_client::{
    client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol},
    errors::OciDistributionError,
    secrets::RegistryAuth,
    Reference, RegistryOperation,
};
use sha2::{Digest, Sha256};

use super::{
    auth::{self, Credentials},
    hosts::{self, Endpoint, Use},
    Access,
};
use crate::{Error, Result};
pub use raw::MAX_MANIFEST;

/// What one read or write of a blob file moves.
const CHUNK: usize = 4 << 20;

/// The least a body must bring in each [`RATE_WINDOW`]: a registry that sends a byte now and
/// then (which no read timeout notices) is cut off rather than holding a pull for ever.
pub const MIN_RATE: u64 = 64 << 10;
pub const RATE_WINDOW: Duration = Duration::from_secs(30);

pub struct Session {
    rt: tokio::runtime::Runtime,
    client: oci_client::Client,
    auth: RegistryAuth,
    credentials: Credentials,
    who: String,
    pub endpoint: Endpoint,
    /// The registry references name (a mirror serves it under its own host).
    registry: String,
    /// When every call of this session must have ended (the transfer's time limit).
    deadline: Option<Instant>,
    /// The HTTP client of `raw`'s requests, made on first use and kept so that its
    /// connections are reused.
    http: std::sync::OnceLock<reqwest::Client>,
}

/// The endpoints `reference` may use for `u`, each a session, in the order to try them.
pub fn sessions(access: &Access, reference: &Reference, u: Use) -> Result<Vec<Session>> {
    sessions_as(access, reference, u, None)
}

/// Like [`sessions`], with credentials already looked up (a lazy blob's server gets them
/// from the pull that started it, over a pipe).
pub fn sessions_as(
    access: &Access,
    reference: &Reference,
    u: Use,
    credentials: Option<&Credentials>,
) -> Result<Vec<Session>> {
    let registry = reference.registry().to_string();
    let endpoints = hosts::endpoints(&access.hosts_dir, &registry, access.plain_http)?;
    let usable: Vec<Endpoint> = endpoints.into_iter().filter(|e| e.can(u)).collect();
    if usable.is_empty() {
        return Err(format!(
            "no host for {registry} may be used to {} (see {}/{registry}/hosts.toml)",
            match u {
                Use::Push => "push",
                Use::Pull | Use::Resolve => "pull",
            },
            access.hosts_dir.display()
        )
        .into());
    }
    usable
        .into_iter()
        .map(|e| Session::open(access, &registry, e, credentials))
        .collect()
}

/// The first endpoint `r` may use that has its manifest (mirrors first, as containerd tries
/// them): that session, the manifest as stored and its digest.
pub fn find_manifest(access: &Access, r: &Reference) -> Result<(Session, Bytes, String)> {
    let want = if r.digest().is_some() {
        Use::Pull
    } else {
        Use::Resolve
    };
    let mut tried = Vec::new();
    for s in sessions(access, r, want)? {
        match s.manifest(r, &[chalk_runtime::snapshot::oci::MANIFEST]) {
            Ok((bytes, digest)) => return Ok((s, bytes, digest)),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(Error::from(tried.join("; then ")))
}

impl Session {
    fn open(
        access: &Access,
        registry: &str,
        endpoint: Endpoint,
        credentials: Option<&Credentials>,
    ) -> Result<Session> {
        // rustls without a default provider (see Cargo.toml): ring, once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut extra = Vec::new();
        for path in &endpoint.ca {
            let data = std::fs::read(path).map_err(|e| {
                Error::from(format!(
                    "CA file {} for {}: {e}",
                    path.display(),
                    endpoint.host
                ))
            })?;
            extra.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let config = ClientConfig {
            protocol: if endpoint.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            accept_invalid_certificates: endpoint.skip_verify,
            extra_root_certificates: extra,
            // Blob sizes are known: one PUT each, not a PATCH per few megabytes.
            use_monolithic_push: true,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(120)),
            ..Default::default()
        };
        let credentials = match credentials {
            Some(c) => c.clone(),
            None => auth::lookup(&endpoint.host, access.user.as_deref())?,
        };
        let who = credentials.describe();
        let auth = match &credentials {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { user, password } => {
                RegistryAuth::Basic(user.clone(), password.clone())
            }
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::from(format!("start a runtime: {e}")))?;
        Ok(Session {
            rt,
            client: oci_client::Client::new(config),
            auth,
            credentials,
            who,
            endpoint,
            registry: registry.to_string(),
            deadline: access.deadline,
            http: std::sync::OnceLock::new(),
        })
    }

    /// Runs `fut` to its end, or to this session's deadline (an error saying so).
    fn wait<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, OciDistributionError>>,
    ) -> std::result::Result<T, OciDistributionError> {
        self.wait_io(fut).map_err(|e| match e {
            raw::Waited::Failed(e) => e,
            raw::Waited::Late(limit) => OciDistributionError::GenericError(Some(late_text(limit))),
        })
    }

    /// As [`Session::wait`], for any error type.
    fn wait_io<T, E>(
        &self,
        fut: impl Future<Output = std::result::Result<T, E>>,
    ) -> std::result::Result<T, raw::Waited<E>> {
        match self.deadline {
            None => self.rt.block_on(fut).map_err(raw::Waited::Failed),
            Some(d) => {
                let limit = d.saturating_duration_since(Instant::now());
                // The timer is made inside the runtime: it needs its clock.
                self.rt
                    .block_on(async { tokio::time::timeout_at(d.into(), fut).await })
                    .map_err(|_| raw::Waited::Late(limit))?
                    .map_err(raw::Waited::Failed)
            }
        }
    }

    /// `r` as this endpoint serves it: a mirror is asked with the upstream's name (`?ns=`).
    fn at(&self, r: &Reference) -> Reference {
        let mut r = r.clone();
        if self.endpoint.host != self.registry {
            r.set_mirror_registry(self.endpoint.host.clone());
        }
        r
    }

    /// The tags of `r`'s repository.
    pub fn tags(&self, r: &Reference) -> Result<Vec<String>> {
        let r = self.at(r);
        self.wait(self.client.list_tags(&r, &self.auth, None, None))
            .map(|t| t.tags)
            .map_err(|e| self.explain("list the tags of", &r, e))
    }

    /// Authenticates for `op` on `r`'s repository (a registry with token auth hands out one
    /// token per repository and operation).
    pub fn login(&self, r: &Reference, op: RegistryOperation) -> Result<()> {
        let r = self.at(r);
        self.wait(self.client.auth(&r, &self.auth, op))
            .map(drop)
            .map_err(|e| self.explain("log in", &r, e))
    }

    /// Manifest `r` (by tag or digest) as the registry stores it, and its digest (checked
    /// against the reference's own digest when it has one).
    pub fn manifest(&self, r: &Reference, accept: &[&str]) -> Result<(Bytes, String)> {
        self.try_manifest(r, accept)?.ok_or_else(|| {
            let at = self.at(r).whole();
            Error::from(format!(
                "fetch the manifest of {at}: {at} does not exist (404)"
            ))
        })
    }

    /// Like [`Session::manifest`], None when there is no such manifest.
    pub fn try_manifest(&self, r: &Reference, accept: &[&str]) -> Result<Option<(Bytes, String)>> {
        let at = self.at(r);
        let bytes = match self.get_manifest(r, accept)? {
            raw::Got::Manifest(bytes) => bytes,
            raw::Got::NotFound => return Ok(None),
        };
        let digest = format!("sha256:{:x}", Sha256::digest(&bytes));
        if let Some(want) = r.digest() {
            if want != digest {
                return Err(format!(
                    "{}: the registry answered with a manifest of digest {digest}, not {want}: \
                     refused",
                    self.name(&at)
                )
                .into());
            }
        }
        Ok(Some((bytes, digest)))
    }

    /// Whether the repository of `r` holds manifest `digest`.
    pub fn has_manifest(&self, r: &Reference, digest: &str) -> Result<bool> {
        let at = self.at(&r.clone_with_digest(digest.to_string()));
        match self.wait(self.client.fetch_manifest_digest(&at, &self.auth)) {
            Ok(_) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(self.explain("look up a manifest", &at, e)),
        }
    }

    pub fn has_blob(&self, r: &Reference, digest: &str) -> Result<bool> {
        let at = self.at(r);
        self.wait(self.client.blob_exists(&at, digest))
            .map_err(|e| self.explain(&format!("look up blob {digest}"), &at, e))
    }

    /// Asks the registry to link blob `digest` from repository `from` into `r`'s: whether it
    /// did (a registry may answer with an upload instead, which is then abandoned).
    pub fn mount_blob(&self, r: &Reference, from: &Reference, digest: &str) -> Result<bool> {
        let at = self.at(r);
        match self.wait(self.client.mount_blob(&at, from, digest)) {
            Ok(()) => self.has_blob(r, digest),
            Err(_) => Ok(false),
        }
    }

    pub fn push_bytes(&self, r: &Reference, data: Vec<u8>, digest: &str) -> Result<()> {
        let at = self.at(r);
        self.wait(self.client.push_blob(&at, data, digest))
            .map(drop)
            .map_err(|e| self.explain(&format!("push blob {digest}"), &at, e))
    }

    /// Pushes file `path` as blob `digest` of `size` bytes, streamed from disk.
    pub fn push_file(&self, r: &Reference, path: &Path, digest: &str, size: u64) -> Result<()> {
        let at = self.at(r);
        let file = std::fs::File::open(path)
            .map_err(|e| Error::from(format!("open {}: {e}", path.display())))?;
        self.wait(async {
            let file = tokio::fs::File::from_std(file);
            let stream = futures_util::stream::unfold(file, |mut f| async move {
                use tokio::io::AsyncReadExt;
                let mut buf = vec![0u8; CHUNK];
                match f.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok(Bytes::from(buf)), f))
                    }
                    Err(e) => Some((Err(OciDistributionError::IoError(e)), f)),
                }
            });
            self.client
                .push_blob_stream(&at, stream, digest, Some(size))
                .await
        })
        .map(drop)
        .map_err(|e| self.explain(&format!("push blob {digest}"), &at, e))
    }

    /// Stores manifest `bytes` under `r` (a tag, or its digest).
    pub fn push_manifest(&self, r: &Reference, bytes: Vec<u8>, media_type: &str) -> Result<()> {
        let at = self.at(r);
        let content_type = media_type
            .parse()
            .map_err(|_| Error::from(format!("media type {media_type:?}")))?;
        self.wait(self.client.push_manifest_raw(&at, bytes, content_type))
            .map(drop)
            .map_err(|e| self.explain("push the manifest", &at, e))
    }

    /// Blob `digest` (at most `limit` bytes), checked against its digest.
    pub fn blob(&self, r: &Reference, digest: &str, limit: u64) -> Result<Vec<u8>> {
        let at = self.at(r);
        let mut out = Vec::new();
        self.wait(async {
            let mut s = self.client.pull_blob_stream(&at, digest).await?;
            let mut rate = Rate::new();
            while let Some(chunk) = s.stream.next().await {
                let chunk = chunk?;
                rate.note(chunk.len())?;
                out.extend_from_slice(&chunk);
                if out.len() as u64 > limit {
                    return Err(OciDistributionError::GenericError(Some(format!(
                        "blob {digest} is larger than the {limit} bytes it may be"
                    ))));
                }
            }
            Ok(())
        })
        .map_err(|e| self.explain(&format!("fetch blob {digest}"), &at, e))?;
        check_digest(digest, &format!("{:x}", Sha256::digest(&out)))?;
        Ok(out)
    }

    /// Writes blob `digest` of `size` bytes to `path` (made 0600): refused, and the file
    /// removed, unless it is `size` bytes that hash to `digest`. oci-client's blob stream
    /// hashes what it yields and fails its last read on a mismatch, so the bytes are hashed
    /// once, on the way (a second hash here cost a quarter of a 1 GB pull).
    pub fn blob_to_file(&self, r: &Reference, digest: &str, size: u64, path: &Path) -> Result<()> {
        let checked = (|| {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| Error::from(format!("{}: {e}", path.display())))?;
            let mut file = std::io::BufWriter::with_capacity(CHUNK, file);
            self.blob_to_writer(r, digest, size, &mut file)?;
            file.flush()
                .map_err(|e| Error::from(format!("{}: {e}", path.display())))
        })();
        if checked.is_err() {
            let _ = std::fs::remove_file(path);
        }
        checked
    }

    /// Blob `digest` of `size` bytes written to `out` as it arrives; fails, having written
    /// part of it, unless it is `size` bytes that hash to `digest` (oci-client's stream
    /// hashes what it yields and fails its last read on a mismatch).
    pub fn blob_to_writer(
        &self,
        r: &Reference,
        digest: &str,
        size: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<()> {
        let at = self.at(r);
        let fetched = self.wait(async {
            let mut s = self.client.pull_blob_stream(&at, digest).await?;
            let mut got = 0u64;
            let mut rate = Rate::new();
            while let Some(chunk) = s.stream.next().await {
                let chunk = chunk?;
                rate.note(chunk.len())?;
                got += chunk.len() as u64;
                if got > size {
                    return Err(OciDistributionError::GenericError(Some(format!(
                        "blob {digest} is larger than the {size} bytes the manifest says"
                    ))));
                }
                out.write_all(&chunk)?;
            }
            Ok(got)
        });
        match fetched {
            Ok(got) if got != size => Err(Error::from(format!(
                "blob {digest}: the registry sent {got} bytes, the manifest says {size}"
            ))),
            Ok(_) => Ok(()),
            Err(e) => Err(self.explain(&format!("fetch blob {digest}"), &at, e)),
        }
    }

    /// The credentials this session uses (handed to a lazy blob's server, never logged).
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Bytes `offset..offset+len` of blob `digest`, handed to `sink` as they come. Unchecked:
    /// the caller checks them against piece digests. Refused when the registry answers with
    /// the whole blob instead of the range (it does not serve ranges).
    pub fn blob_range(
        &self,
        r: &Reference,
        digest: &str,
        offset: u64,
        len: u64,
        mut sink: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let at = self.at(r);
        let layer = oci_client::manifest::OciDescriptor {
            digest: digest.to_string(),
            ..Default::default()
        };
        let mut failed_sink = None;
        let fetched = self.wait(async {
            let response = self
                .client
                .pull_blob_stream_partial(&at, &layer, offset, Some(len))
                .await?;
            let mut stream = match response {
                oci_client::client::BlobResponse::Partial(s) => s.stream,
                oci_client::client::BlobResponse::Full(_) => {
                    return Err(OciDistributionError::GenericError(Some(
                        "the registry does not serve byte ranges of blobs (it answered a \
                         range request with the whole blob)"
                            .to_string(),
                    )))
                }
            };
            let mut got = 0u64;
            let mut rate = Rate::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                rate.note(chunk.len())?;
                got += chunk.len() as u64;
                if got > len {
                    return Err(OciDistributionError::GenericError(Some(format!(
                        "the registry sent more than the {len} bytes asked for"
                    ))));
                }
                if let Err(e) = sink(&chunk) {
                    failed_sink = Some(e);
                    return Ok(got);
                }
            }
            Ok(got)
        });
        if let Some(e) = failed_sink {
            return Err(e);
        }
        match fetched {
            Ok(got) if got == len => Ok(()),
            Ok(got) => Err(format!(
                "fetch bytes {offset}..{} of blob {digest} of {}: the connection ended after \
                 {got} of {len} bytes",
                offset + len,
                at.whole()
            )
            .into()),
            Err(e) => Err(self.explain(
                &format!("fetch bytes {offset}..{} of blob {digest}", offset + len),
                &at,
                e,
            )),
        }
    }

    fn name(&self, r: &Reference) -> String {
        format!("{} ({})", r.whole(), self.endpoint.url())
    }
}

/// The slowest a body may come in: at least [`MIN_RATE`] bytes each [`RATE_WINDOW`].
pub(super) struct Rate {
    since: Instant,
    bytes: u64,
}

impl Rate {
    pub(super) fn new() -> Rate {
        Rate {
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `n` bytes just in: an error once a whole window brought too few.
    pub(super) fn note(&mut self, n: usize) -> std::result::Result<(), OciDistributionError> {
        self.bytes += n as u64;
        let window = self.since.elapsed();
        if window < RATE_WINDOW {
            return Ok(());
        }
        if self.bytes < MIN_RATE {
            return Err(OciDistributionError::GenericError(Some(format!(
                "the registry sent {} bytes in {}s, slower than the {} KiB each {}s a transfer \
                 must keep up: cut off (is it overloaded, or hostile?)",
                self.bytes,
                window.as_secs(),
                MIN_RATE >> 10,
                RATE_WINDOW.as_secs()
            ))));
        }
        *self = Rate::new();
        Ok(())
    }
}

fn late_text(limit: Duration) -> String {
    format!(
        "it did not finish within the {}s this transfer may take: cut off (the registry is too \
         slow, or never ends its answer)",
        limit.as_secs()
    )
}

/// `what` of `shown` ran past the transfer's deadline (`limit` after it began waiting).
fn late(what: &str, shown: &str, limit: Duration) -> Error {
    Error::from(format!("{what} of {shown}: {}", late_text(limit)))
}

fn check_digest(digest: &str, hex: &str) -> Result<()> {
    if digest.strip_prefix("sha256:") != Some(hex) {
        return Err(format!(
            "blob {digest} from the registry hashes to sha256:{hex}: it was changed or damaged; \
             refused (nothing was stored)"
        )
        .into());
    }
    Ok(())
}
