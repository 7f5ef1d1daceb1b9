//! What the shim asks containerd, over the address it was started with, through chalkctl's
//! client: the image a container runs (a snapshot records it, name and digest; a restore
//! refuses an image whose name now points at another digest) and a label on its record (when
//! its lifetime ends). Behind a trait, so the Task layer is tested without containerd.

use std::sync::Mutex;

use chalk_client::containerd::Client;
use chalk_runtime::snapshot::{manifest::ImageRef, oci::Descriptor};

use crate::errors::{Result, ShimError};

/// containerd's records of this shim's containers.
pub trait Records: Send + Sync {
    fn image_of(&self, id: &str) -> Result<Option<ImageRef>>;
    /// Sets label `key` of container `id`, touching no other.
    fn set_label(&self, id: &str, key: &str, value: &str) -> Result<()>;
    /// Label `key` of container `id`, if it has it.
    fn label(&self, id: &str, key: &str) -> Result<Option<String>>;
    /// What a stored snapshot of container `id` keeps of containerd's records: the
    /// container's spec as containerd holds it, and its base image's manifest.
    fn snapshot_facts(&self, id: &str) -> Result<SnapshotFacts>;
}

pub struct SnapshotFacts {
    pub spec: Vec<u8>,
    /// The type of containerd's spec (its protobuf Any's type URL).
    pub spec_type: String,
    pub base: Option<Descriptor>,
    /// The snapshotter of the container's root filesystem (a fork's is made by the same).
    pub snapshotter: String,
}

/// The containerd that started the shim, over one connection kept for the shim's life (a
/// connection costs a runtime's threads and a handshake: a few milliseconds of every
/// checkpoint and restore).
pub struct Containerd {
    address: String,
    namespace: String,
    client: Mutex<Option<Client>>,
}

impl Containerd {
    pub fn new(address: &str, namespace: &str) -> Self {
        Containerd {
            address: address.to_string(),
            namespace: namespace.to_string(),
            client: Mutex::new(None),
        }
    }

    fn connect(&self) -> Result<Client> {
        if self.address.is_empty() {
            return Err(ShimError::FailedPrecondition(
                "the shim was not given containerd's address: cannot ask containerd".into(),
            ));
        }
        Client::connect(&self.address, &self.namespace).map_err(asked)
    }

    /// `ask` of containerd, on the kept connection; once more on a new one when it fails (a
    /// containerd restarted since).
    fn ask<T>(&self, ask: impl Fn(&Client) -> chalk_client::Result<T>) -> Result<T> {
        let mut kept = self.client.lock().unwrap();
        if let Some(client) = kept.as_ref() {
            if let Ok(answer) = ask(client) {
                return Ok(answer);
            }
        }
        let client = kept.insert(self.connect()?);
        ask(client).map_err(asked)
    }
}

fn asked(e: chalk_client::Error) -> ShimError {
    ShimError::Containerd(e)
}

impl Records for Containerd {
    fn image_of(&self, id: &str) -> Result<Option<ImageRef>> {
        self.ask(|c| c.image_of(id))
    }

    fn set_label(&self, id: &str, key: &str, value: &str) -> Result<()> {
        self.ask(|c| c.set_container_label(id, key, Some(value)))
    }

    fn label(&self, id: &str, key: &str) -> Result<Option<String>> {
        self.ask(|c| Ok(c.container(id)?.labels.get(key).cloned()))
    }

    fn snapshot_facts(&self, id: &str) -> Result<SnapshotFacts> {
        let (container, base) = self.ask(|c| {
            let container = c.container(id)?;
            let base = match container.image.as_str() {
                "" => None,
                image => Some(chalk_client::records::snapshots::base_image(c, image)?.1),
            };
            Ok((container, base))
        })?;
        let (spec_type, spec) = container
            .spec
            .map(|s| (s.type_url, s.value))
            .unwrap_or_default();
        let base = base.map(|d| Descriptor::new(&d.media_type, &d.digest, d.size.max(0) as u64));
        Ok(SnapshotFacts {
            spec,
            spec_type,
            base,
            snapshotter: container.snapshotter,
        })
    }
}
