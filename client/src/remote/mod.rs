//! Snapshots that travel: pushed to and pulled from OCI registries in the form the snapshot
//! store keeps them (one OCI 1.1 artifact manifest, `subject` the base image, a blob per
//! runsc file), so a snapshot keeps its id (its manifest's digest) on every host, and a host
//! fetches only the blobs it lacks. Registry access follows containerd's: hosts.toml for
//! mirrors and CAs, credentials from `--user` or the docker config, HTTPS unless asked.

pub mod auth;
pub mod crypt;
pub mod hosts;
mod image;
pub mod lazy;
pub mod moves;
mod packed;
pub mod prune;
pub mod pull;
pub mod push;
pub mod session;
pub mod sign;
pub mod trust;

use std::path::PathBuf;

use oci_client::Reference;

use crate::{Error, Result};

/// How to reach registries: from the command line.
#[derive(Debug, Clone)]
pub struct Access {
    /// containerd's registry hosts directory (hosts.toml per host).
    pub hosts_dir: PathBuf,
    /// Plain HTTP to registries that hosts.toml does not name otherwise.
    pub plain_http: bool,
    /// `user[:password]`, else the docker config's credentials.
    pub user: Option<String>,
    /// The program that serves a memory file while it arrives (chalkctl's `serve-lazy`);
    /// none: a pull fetches everything before it ends.
    pub lazy_server: Option<PathBuf>,
    /// Pushes encrypt every blob for these (`age1…` keys, or files of them).
    pub encrypt_to: Vec<String>,
    /// Pushes sign the pushed manifest with this key (PEM, P-256).
    pub sign_with: Option<PathBuf>,
    /// When every registry call of a transfer must have ended (none: no limit but the
    /// slowest rate a body may come in at, [`session::MIN_RATE`]).
    pub deadline: Option<std::time::Instant>,
    /// The Kubernetes namespace a pull is made for (a pod's `chalk.io/restore-from`): the
    /// owner of the copy it leaves in the store.
    pub pulled_for: Option<String>,
}

impl Access {
    /// Plain HTTPS access with the default credentials, as the node agent and tools use.
    pub fn new(hosts_dir: PathBuf) -> Access {
        Access {
            hosts_dir,
            plain_http: false,
            user: None,
            lazy_server: None,
            encrypt_to: Vec::new(),
            sign_with: None,
            deadline: None,
            pulled_for: None,
        }
    }

    /// The recipients pushes encrypt for, checked: none, and pushes are plain.
    pub fn recipients(&self) -> Result<Option<crypt::Recipients>> {
        if self.encrypt_to.is_empty() {
            return Ok(None);
        }
        crypt::Recipients::parse(&self.encrypt_to).map(Some)
    }

    /// Refuses recipients or a signing key that a push could not use (before a suspend
    /// stops its sandbox).
    pub fn check_push(&self) -> Result<()> {
        self.recipients()?;
        if let Some(key) = &self.sign_with {
            sign::SigningKey::load(key)?;
        }
        Ok(())
    }
}

/// Parses a registry reference (`host[:port]/repo[:tag][@digest]`) as docker and containerd
/// do; refuses what is not one.
pub fn reference(text: &str) -> Result<Reference> {
    let r: Reference = text.parse().map_err(|e| {
        Error::parse(
            "registry reference",
            format!("{text:?}: {e} (expected host[:port]/repository[:tag][@sha256:digest])"),
        )
    })?;
    Ok(r)
}

/// An OCI descriptor of the snapshot store as containerd's API takes it.
fn to_containerd(
    d: &chalk_runtime::snapshot::oci::Descriptor,
) -> containerd_client::types::Descriptor {
    containerd_client::types::Descriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.clone(),
        size: d.size as i64,
        annotations: Default::default(),
    }
}

/// What a transfer moved and what it found already there.
#[derive(Debug, Default, Clone)]
pub struct Transfer {
    pub blobs_moved: usize,
    pub bytes_moved: u64,
    pub blobs_present: usize,
    pub bytes_present: u64,
    /// Blobs of the base image moved (it was missing on the other side).
    pub base_blobs: usize,
    /// Bytes left to arrive while the sandbox runs (a memory file served as it comes).
    pub bytes_arriving: u64,
}

impl Transfer {
    fn moved(&mut self, bytes: u64) {
        self.blobs_moved += 1;
        self.bytes_moved += bytes;
    }

    fn present(&mut self, bytes: u64) {
        self.blobs_present += 1;
        self.bytes_present += bytes;
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "blobs_moved": self.blobs_moved,
            "bytes_moved": self.bytes_moved,
            "blobs_present": self.blobs_present,
            "bytes_present": self.bytes_present,
            "base_image_blobs_moved": self.base_blobs,
            "bytes_arriving": self.bytes_arriving,
        })
    }
}

/// Sends OCI's empty config of snapshot `stored` unless the registry has it (both forms of a
/// push send it).
fn send_config(
    s: &session::Session,
    r: &oci_client::Reference,
    stored: &chalk_runtime::snapshot::store::Stored,
    t: &mut Transfer,
) -> Result<()> {
    let config = &stored.oci.config;
    if s.has_blob(r, &config.digest)? {
        t.present(config.size);
    } else {
        s.push_bytes(
            r,
            chalk_runtime::snapshot::oci::EMPTY_DATA.to_vec(),
            &config.digest,
        )?;
        t.moved(config.size);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::reference;

    #[test]
    fn references_are_read_as_docker_reads_them() {
        let r = reference("127.0.0.1:5000/snaps/web:v1").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "snaps/web", Some("v1"))
        );
        let r = reference("busybox").unwrap();
        assert_eq!(
            (r.registry(), r.repository()),
            ("docker.io", "library/busybox")
        );
        let err = reference("Bad Ref").unwrap_err().to_string();
        assert!(err.contains("expected host[:port]/repository"), "{err}");
    }
}
