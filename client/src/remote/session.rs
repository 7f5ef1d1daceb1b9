//! One registry endpoint, spoken to over the OCI distribution API (`oci-client`), with calls
//! that block: chalkctl is a command line, and its containerd client blocks too. Every blob
//! fetched is checked against its digest before anything uses it.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path, time::Duration};

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

/// What one read or write of a blob file moves.
const CHUNK: usize = 4 << 20;

pub struct Session {
    rt: tokio::runtime::Runtime,
    client: oci_client::Client,
    auth: RegistryAuth,
    credentials: Credentials,
    who: String,
    pub endpoint: Endpoint,
    /// The registry references name (a mirror serves it under its own host).
    registry: String,
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
        })
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
        self.rt
            .block_on(self.client.list_tags(&r, &self.auth, None, None))
            .map(|t| t.tags)
            .map_err(|e| self.explain("list the tags of", &r, e))
    }

    /// Deletes manifest `digest` from `r`'s repository, and so the tags that name it: false
    /// when the registry has no such manifest. oci-client has no delete, so this is one
    /// request of its own, with this endpoint's CA files and credentials (or the token the
    /// registry hands out for pushes).
    pub fn delete_manifest(&self, r: &Reference, digest: &str) -> Result<bool> {
        let r = self.at(r);
        let token = self
            .rt
            .block_on(self.client.auth(&r, &self.auth, RegistryOperation::Push))
            .map_err(|e| self.explain("log in to delete from", &r, e))?;
        let mut http = reqwest::Client::builder()
            .danger_accept_invalid_certs(self.endpoint.skip_verify)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60));
        for path in &self.endpoint.ca {
            let pem = std::fs::read(path)
                .map_err(|e| Error::from(format!("CA file {}: {e}", path.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| Error::from(format!("CA file {}: {e}", path.display())))?;
            http = http.add_root_certificate(cert);
        }
        let http = http
            .build()
            .map_err(|e| Error::from(format!("an HTTP client: {e}")))?;
        let url = format!(
            "{}/v2/{}/manifests/{digest}",
            self.endpoint.url(),
            r.repository()
        );
        let mut req = http.delete(&url);
        req = match (&token, &self.credentials) {
            (Some(t), _) => req.bearer_auth(t),
            (None, Credentials::Basic { user, password }) => req.basic_auth(user, Some(password)),
            (None, Credentials::Anonymous) => req,
        };
        let status = self
            .rt
            .block_on(req.send())
            .map_err(|e| Error::from(format!("DELETE {url}: {e}")))?
            .status();
        match status.as_u16() {
            200..=299 => Ok(true),
            404 => Ok(false),
            405 => Err(format!(
                "{} does not allow deletes (405): enable them there (Distribution: \
                 storage.delete.enabled, REGISTRY_STORAGE_DELETE_ENABLED=true)",
                self.endpoint.host
            )
            .into()),
            401 | 403 => Err(format!(
                "{} refused the delete of {digest} to {} ({status}): give credentials that \
                 may delete",
                self.endpoint.host, self.who
            )
            .into()),
            _ => Err(format!("DELETE {url}: {status}").into()),
        }
    }

    /// Authenticates for `op` on `r`'s repository (a registry with token auth hands out one
    /// token per repository and operation).
    pub fn login(&self, r: &Reference, op: RegistryOperation) -> Result<()> {
        let r = self.at(r);
        self.rt
            .block_on(self.client.auth(&r, &self.auth, op))
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
        let bytes = match self
            .rt
            .block_on(self.client.pull_manifest_raw(&at, &self.auth, accept))
        {
            Ok((bytes, _)) => bytes,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(self.explain("fetch the manifest", &at, e)),
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
        match self
            .rt
            .block_on(self.client.fetch_manifest_digest(&at, &self.auth))
        {
            Ok(_) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(self.explain("look up a manifest", &at, e)),
        }
    }

    pub fn has_blob(&self, r: &Reference, digest: &str) -> Result<bool> {
        let at = self.at(r);
        self.rt
            .block_on(self.client.blob_exists(&at, digest))
            .map_err(|e| self.explain(&format!("look up blob {digest}"), &at, e))
    }

    /// Asks the registry to link blob `digest` from repository `from` into `r`'s: whether it
    /// did (a registry may answer with an upload instead, which is then abandoned).
    pub fn mount_blob(&self, r: &Reference, from: &Reference, digest: &str) -> Result<bool> {
        let at = self.at(r);
        match self.rt.block_on(self.client.mount_blob(&at, from, digest)) {
            Ok(()) => self.has_blob(r, digest),
            Err(_) => Ok(false),
        }
    }

    pub fn push_bytes(&self, r: &Reference, data: Vec<u8>, digest: &str) -> Result<()> {
        let at = self.at(r);
        self.rt
            .block_on(self.client.push_blob(&at, data, digest))
            .map(drop)
            .map_err(|e| self.explain(&format!("push blob {digest}"), &at, e))
    }

    /// Pushes file `path` as blob `digest` of `size` bytes, streamed from disk.
    pub fn push_file(&self, r: &Reference, path: &Path, digest: &str, size: u64) -> Result<()> {
        let at = self.at(r);
        let file = std::fs::File::open(path)
            .map_err(|e| Error::from(format!("open {}: {e}", path.display())))?;
        self.rt
            .block_on(async {
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
        self.rt
            .block_on(self.client.push_manifest_raw(&at, bytes, content_type))
            .map(drop)
            .map_err(|e| self.explain("push the manifest", &at, e))
    }

    /// Blob `digest` (at most `limit` bytes), checked against its digest.
    pub fn blob(&self, r: &Reference, digest: &str, limit: u64) -> Result<Vec<u8>> {
        let at = self.at(r);
        let mut out = Vec::new();
        self.rt
            .block_on(async {
                let mut s = self.client.pull_blob_stream(&at, digest).await?;
                while let Some(chunk) = s.stream.next().await {
                    out.extend_from_slice(&chunk?);
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
        let fetched = self.rt.block_on(async {
            let mut s = self.client.pull_blob_stream(&at, digest).await?;
            let mut got = 0u64;
            while let Some(chunk) = s.stream.next().await {
                let chunk = chunk?;
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
        let fetched = self.rt.block_on(async {
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
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
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

    /// oci-client's error as what the user can do about it; never a credential.
    fn explain(&self, what: &str, r: &Reference, e: OciDistributionError) -> Error {
        let host = &self.endpoint.host;
        // A blob stream that fails its digest check ends as an I/O error carrying it.
        let damaged = matches!(e, OciDistributionError::DigestError(_))
            || e.to_string().contains("Invalid digest. Expected");
        let text = match &e {
            _ if damaged => format!(
                "what the registry sent does not match its digest ({e}): it was changed or \
                 damaged there; refused (nothing was stored)"
            ),
            OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. } => format!(
                "{host} refused {} (unauthorized): give the right credentials with --user \
                 user[:password] or in the docker config (docker login {host})",
                self.who
            ),
            OciDistributionError::ServerError { code: 401, .. } => format!(
                "{host} refused {} (401 unauthorized): give the right credentials with --user \
                 user[:password] or in the docker config (docker login {host})",
                self.who
            ),
            OciDistributionError::ServerError { code: 403, .. } => {
                format!(
                    "{host} does not allow {} to do this (403 forbidden)",
                    self.who
                )
            }
            e if not_found(e) => format!("{} does not exist (404)", r.whole()),
            OciDistributionError::RequestError(re) => {
                let mut chain = re.to_string();
                let mut source = std::error::Error::source(re);
                while let Some(s) = source {
                    chain.push_str(": ");
                    chain.push_str(&s.to_string());
                    source = s.source();
                }
                let hint = if chain.contains("certificate") || chain.contains("UnknownIssuer") {
                    format!(
                        " (trust the registry's CA: put it in {host}'s directory of the hosts \
                         directory as ca.crt, or name it in its hosts.toml)"
                    )
                } else if chain.contains("InvalidContentType") || chain.contains("wrong version") {
                    " (is it plain HTTP? then pass --plain-http)".to_string()
                } else if !cut_or_full(&chain).is_empty() {
                    cut_or_full(&chain).to_string()
                } else if chain.contains("onnect") {
                    " (is the registry up, and is this its address?)".to_string()
                } else {
                    String::new()
                };
                format!("{} {chain}{hint}", self.endpoint.url())
            }
            other => {
                let said = other.to_string();
                format!("{}{}", said.trim_end(), cut_or_full(&said))
            }
        };
        Error::from(format!(
            "{what} of {}: {}",
            r.whole(),
            without_url_queries(&text)
        ))
    }
}

/// What to do about a transfer the registry cut off or could not store.
fn cut_or_full(text: &str) -> &'static str {
    let t = text.to_ascii_lowercase();
    if t.contains("os error 28") {
        " (this host's disk is full: make room where the snapshot store is, then run the same \
         command again)"
    } else if t.contains("no space left") {
        " (the registry's storage is full: make room there, then push again; the blobs it \
         has already are not sent again)"
    } else if [
        "error decoding response body",
        "connection reset",
        "broken pipe",
        "unexpected eof",
        "incompletemessage",
    ]
    .iter()
    .any(|m| t.contains(m))
    {
        " (the connection to the registry broke mid-transfer: run the same command again \
         once it is back)"
    } else {
        ""
    }
}

/// `text` with every URL's query cut off: an upload URL's `_state` is a session of the
/// registry's, noise at best in an error.
fn without_url_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | ',' | '"' | '\''))
            .unwrap_or(tail.len());
        let url = &tail[..end];
        out.push_str(url.split_once('?').map_or(url, |(u, _)| u));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Whether the registry said there is no such manifest or repository.
fn not_found(e: &OciDistributionError) -> bool {
    use oci_client::errors::OciErrorCode;
    match e {
        OciDistributionError::ImageManifestNotFoundError(_)
        | OciDistributionError::ServerError { code: 404, .. } => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown
            )
        }),
        _ => false,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_queries_are_cut_from_errors() {
        let text = "Server error: url https://r:5000/v2/a/blobs/uploads/1?_state=SECRET&digest=x, \
                    code: 500 (see http://r/x?y=1)";
        let cut = without_url_queries(text);
        assert_eq!(
            cut,
            "Server error: url https://r:5000/v2/a/blobs/uploads/1, code: 500 (see http://r/x)"
        );
        assert_eq!(without_url_queries("no url here"), "no url here");
    }

    #[test]
    fn a_full_or_cut_transfer_says_what_to_do() {
        assert!(cut_or_full("write …/data: no space left on device").contains("registry's"));
        assert!(cut_or_full("No space left on device (os error 28)").contains("this host's"));
        assert!(cut_or_full("error decoding response body").contains("run the same command"));
        assert!(cut_or_full("Connection reset by peer (os error 104)").contains("again"));
        assert_eq!(cut_or_full("404 not found"), "");
    }
}
