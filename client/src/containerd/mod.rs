//! containerd's API as chalk uses it, blocking, over one connection: one file per service. Every call runs in
//! the chosen namespace and, once a lease is taken, under it (so containerd's garbage
//! collector keeps what a half-finished command wrote).

mod containers;
mod content;
mod images;
mod leases;
mod snapshotter;
mod tasks;

pub use containers::spec_of;

use std::collections::HashMap;

use containerd_client::{
    services::v1::{
        container::Runtime,
        containers_client::ContainersClient,
        content_client::ContentClient,
        diff_client::DiffClient,
        images_client::ImagesClient,
        leases_client::LeasesClient,
        snapshots::{
            snapshots_client::SnapshotsClient, CommitSnapshotRequest, MountsRequest,
            PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
        },
        tasks_client::TasksClient,
        AddResourceRequest, ApplyRequest, CheckpointTaskRequest, CloseIoRequest, Container,
        CreateContainerRequest, CreateImageRequest, CreateRequest as CreateLease,
        CreateTaskRequest, DeleteContainerRequest, DeleteImageRequest, DeleteProcessRequest,
        DeleteRequest as DeleteLease, DeleteTaskRequest, ExecProcessRequest, GetContainerRequest,
        GetImageRequest, GetRequest as GetTaskRequest, Image, Info as ContentInfo,
        InfoRequest as ContentInfoRequest, KillRequest, ListContainersRequest, ListImagesRequest,
        ReadContentRequest, ResizePtyRequest, Resource as LeaseResource, StartRequest,
        UpdateContainerRequest, UpdateImageRequest, UpdateRequest as UpdateContentRequest,
        UpdateTaskRequest, WaitRequest, WriteAction, WriteContentRequest,
    },
    tonic::{transport::Channel, Code, Request, Status},
    types::{Descriptor, Mount},
    with_namespace,
};

use crate::error::Error;
pub use crate::error::Result;
use chalk_runtime::snapshot::manifest::ImageRef;

/// Where a task's stdio goes: fifos (or files) its client owns, and whether its init has a
/// terminal (then stdout carries both output streams and stderr is empty).
#[derive(Debug, Clone, Default)]
pub struct Stdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

pub struct Client {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    /// containerd's socket.
    address: String,
    namespace: String,
    lease: Option<String>,
    /// A lease of [`Client::under_own_lease`], for callers holding `&Client`.
    scoped_lease: std::sync::Mutex<Option<String>>,
    /// The shim's runtime options, which name the snapshot store it shares with chalkctl
    /// (else the ones the shim reads by default).
    config: Option<std::path::PathBuf>,
}

fn describe(what: &str, e: Status) -> Error {
    Error::containerd(what, e)
}

impl Client {
    pub fn connect(address: &str, namespace: &str) -> Result<Self> {
        // Two workers: `fork --count N` makes its forks from N threads sharing this client.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::from(format!("start a runtime: {e}")))?;
        let socket = address
            .strip_prefix("unix://")
            .unwrap_or(address)
            .to_string();
        let channel = rt
            .block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    containerd_client::connect(&socket),
                )
                .await
            })
            .map_err(|_| Error::from(format!("containerd at {socket} did not answer within 10 s")))?
            .map_err(|e| {
                format!("cannot reach containerd at {socket}: {e} (is it running? set --address or CONTAINERD_ADDRESS)")
            })?;
        Ok(Client {
            rt,
            channel,
            address: socket,
            namespace: namespace.to_string(),
            lease: None,
            scoped_lease: Default::default(),
            config: None,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// containerd's socket this client speaks to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Reads the snapshot store's place from the runtime options at `path` (when it is needed).
    pub fn set_config(&mut self, path: std::path::PathBuf) {
        self.config = Some(path);
    }

    /// The shim's runtime options (`--config`, else the ones it reads by default).
    pub fn options(&self) -> Result<chalk_runtime::options::RuntimeOptions> {
        use chalk_runtime::options::RuntimeOptions;
        match &self.config {
            Some(path) => RuntimeOptions::load(path),
            None => RuntimeOptions::load_default(),
        }
        .map_err(|e| Error::from(e.to_string()))
    }

    /// The snapshot store the shim's `[snapshot] store` option names, opened (made if need be).
    pub fn store(&self) -> Result<chalk_runtime::snapshot::store::Store> {
        let opts = self.options()?;
        chalk_runtime::snapshot::store::Store::open(&opts.snapshot.store)
            .map_err(|e| Error::from(e.to_string()))
    }

    fn req<T>(&self, msg: T) -> Request<T> {
        let mut req = with_namespace!(msg, self.namespace);
        let scoped = self.scoped_lease.lock().unwrap().clone();
        if let Some(lease) = self.lease.as_ref().or(scoped.as_ref()) {
            if let Ok(v) = lease.parse() {
                req.metadata_mut().insert("containerd-lease", v);
            }
        }
        req
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.release();
    }
}

/// A lookup's answer as whether the thing exists (containerd says NotFound when it does not).
fn exists<T>(found: std::result::Result<T, Status>, what: &str) -> Result<bool> {
    match found {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Code::NotFound => Ok(false),
        Err(e) => Err(describe(what, e)),
    }
}

/// Refuses `data` unless it hashes to `digest` (`sha256:` digests; others are not made here).
pub fn verify_digest(digest: &str, data: &[u8]) -> Result<()> {
    let Some(expected) = digest.strip_prefix("sha256:") else {
        return Err(format!("{digest}: only sha256 digests are supported").into());
    };
    let actual = chalk_runtime::snapshot::hash::sha256_hex(data);
    if actual != expected {
        return Err(format!(
            "{digest} does not verify: its content in containerd's store hashes to sha256:{actual}; \
             the store was changed or damaged: delete what uses it and store it again"
        ).into());
    }
    Ok(())
}

/// The runtime a sandbox runs with.
/// The runtime of chalk-shim, as containerd names it.
pub const RUNTIME: &str = "io.containerd.chalk.v1";

pub fn runtime_name(c: &Container) -> &str {
    c.runtime.as_ref().map_or("", |r: &Runtime| r.name.as_str())
}

fn expire_in(secs: u64) -> String {
    let at = std::time::SystemTime::now() + std::time::Duration::from_secs(secs);
    let secs = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    chalk_runtime::snapshot::manifest::rfc3339_at(secs)
}

#[cfg(test)]
mod tests {
    use super::verify_digest;

    #[test]
    fn blobs_must_hash_to_their_digest() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(verify_digest(empty, b"").is_ok());
        let err = verify_digest(empty, b"x").unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");
        assert!(verify_digest("md5:00", b"").is_err());
    }
}
