//! The requests oci-client cannot make as chalk needs them, made with reqwest on this
//! endpoint's CA files and credentials (or the token the registry hands out): a manifest read
//! with a cap (oci-client reads a body whole, whatever its size), and a manifest's DELETE
//! (oci-client has none).

use std::time::Duration;

use bytes::Bytes;
use oci_client::{Reference, RegistryOperation};

use super::{auth::Credentials, Session};
use crate::{Error, Result};

/// The largest manifest read: the OCI distribution spec has registries accept up to 4 MiB,
/// and a snapshot's is a few KiB.
pub const MAX_MANIFEST: usize = 4 << 20;

/// What a manifest GET answered.
pub(super) enum Got {
    Manifest(Bytes),
    NotFound,
}

impl Session {
    fn http(&self) -> Result<reqwest::Client> {
        if let Some(http) = self.http.get() {
            return Ok(http.clone());
        }
        let mut http = reqwest::Client::builder()
            .danger_accept_invalid_certs(self.endpoint.skip_verify)
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60));
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
        Ok(self.http.get_or_init(|| http).clone())
    }

    /// `req` with the credentials for `op` on `r` (the registry's token, else basic auth).
    fn authorized(
        &self,
        req: reqwest::RequestBuilder,
        r: &Reference,
        op: RegistryOperation,
    ) -> Result<reqwest::RequestBuilder> {
        let token = self
            .wait(self.client.auth(r, &self.auth, op))
            .map_err(|e| self.explain("log in to", r, e))?;
        Ok(match (&token, &self.credentials) {
            (Some(t), _) => req.bearer_auth(t),
            (None, Credentials::Basic { user, password }) => req.basic_auth(user, Some(password)),
            (None, Credentials::Anonymous) => req,
        })
    }

    /// The URL of manifest `reference` (a tag or digest) of `r`'s repository at this endpoint;
    /// a mirror is told the upstream registry (`?ns=`), as containerd tells it.
    fn manifest_url(&self, r: &Reference, reference: &str) -> String {
        let ns = if self.endpoint.host != self.registry {
            format!("?ns={}", self.registry)
        } else {
            String::new()
        };
        format!(
            "{}/v2/{}/manifests/{reference}{ns}",
            self.endpoint.url(),
            r.repository()
        )
    }

    /// Manifest `r` (its digest, else its tag, else `latest`) as stored, read with a cap of
    /// [`MAX_MANIFEST`] bytes and within this session's deadline.
    pub(super) fn get_manifest(&self, r: &Reference, accept: &[&str]) -> Result<Got> {
        let at = self.at(r);
        let reference = at.digest().or(at.tag()).unwrap_or("latest").to_string();
        let url = self.manifest_url(&at, &reference);
        let req = self
            .http()?
            .get(&url)
            .header(reqwest::header::ACCEPT, accept.join(", "));
        let req = self.authorized(req, &at, RegistryOperation::Pull)?;
        let fetched = self.wait_io(async {
            let mut res = req.send().await?;
            let status = res.status();
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(Err(status));
            }
            if !status.is_success() {
                return Ok(Err(status));
            }
            if res
                .content_length()
                .is_some_and(|n| n > MAX_MANIFEST as u64)
            {
                return Ok(Ok(None));
            }
            let mut body = Vec::new();
            let mut rate = super::Rate::new();
            while let Some(chunk) = res.chunk().await? {
                if rate.note(chunk.len()).is_err() {
                    return Ok(Ok(None));
                }
                body.extend_from_slice(&chunk);
                if body.len() > MAX_MANIFEST {
                    return Ok(Ok(None));
                }
            }
            Ok(Ok(Some(body)))
        });
        let shown = at.whole();
        match fetched.map_err(|e| self.request_error("fetch the manifest", &shown, e))? {
            Ok(Some(body)) => Ok(Got::Manifest(Bytes::from(body))),
            Ok(None) => Err(format!(
                "fetch the manifest of {shown}: the registry sent more than the {MAX_MANIFEST} \
                 bytes a manifest may have: refused (nothing was stored)"
            )
            .into()),
            Err(status) if status == reqwest::StatusCode::NOT_FOUND => Ok(Got::NotFound),
            Err(status) if status.as_u16() == 401 || status.as_u16() == 403 => Err(format!(
                "fetch the manifest of {shown}: {} refused {} ({} {}): give the right \
                 credentials with --user user[:password] or in the docker config (docker login \
                 {})",
                self.endpoint.host,
                self.who,
                status.as_u16(),
                status
                    .canonical_reason()
                    .unwrap_or_default()
                    .to_ascii_lowercase(),
                self.endpoint.host
            )
            .into()),
            Err(status) => Err(format!("fetch the manifest of {shown}: {status}").into()),
        }
    }

    /// Deletes manifest `digest` from `r`'s repository, and so the tags that name it: false
    /// when the registry has no such manifest.
    pub fn delete_manifest(&self, r: &Reference, digest: &str) -> Result<bool> {
        let r = self.at(r);
        let url = self.manifest_url(&r, digest);
        let req = self.http()?.delete(&url);
        let req = self.authorized(req, &r, RegistryOperation::Push)?;
        let status = self
            .wait_io(async { req.send().await.map(|res| res.status()) })
            .map_err(|e| self.request_error("DELETE", &url, e))?;
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

    fn request_error(&self, what: &str, shown: &str, e: Waited<reqwest::Error>) -> Error {
        match e {
            Waited::Late(limit) => super::late(what, shown, limit),
            Waited::Failed(e) => Error::from(format!(
                "{what} of {shown}: {}",
                super::explain::without_url_queries(&e.to_string())
            )),
        }
    }
}

/// A request that failed, or ran past the session's deadline.
pub(super) enum Waited<E> {
    Failed(E),
    Late(Duration),
}
