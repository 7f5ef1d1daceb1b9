//! What the shim asks containerd, over the address it was started with, through chalkctl's
//! client: the image a container runs (a snapshot records it, name and digest; a restore
//! refuses an image whose name now points at another digest) and a label on its record (when
//! its lifetime ends). Behind a trait, so the Task layer is tested without containerd.

use chalk_runtime::snapshot::manifest::ImageRef;
use chalkctl::client::Client;

use crate::errors::{Result, ShimError};

/// containerd's records of this shim's containers.
pub trait Records: Send + Sync {
    fn image_of(&self, id: &str) -> Result<Option<ImageRef>>;
    /// Sets label `key` of container `id`, touching no other.
    fn set_label(&self, id: &str, key: &str, value: &str) -> Result<()>;
}

/// The containerd that started the shim.
pub struct Containerd {
    pub address: String,
    pub namespace: String,
}

impl Containerd {
    fn client(&self) -> Result<Client> {
        if self.address.is_empty() {
            return Err(ShimError::FailedPrecondition(
                "the shim was not given containerd's address: cannot ask containerd".into(),
            ));
        }
        Client::connect(&self.address, &self.namespace).map_err(asked)
    }
}

fn asked(e: chalkctl::Error) -> ShimError {
    ShimError::Containerd(e)
}

impl Records for Containerd {
    fn image_of(&self, id: &str) -> Result<Option<ImageRef>> {
        self.client()?.image_of(id).map_err(asked)
    }

    fn set_label(&self, id: &str, key: &str, value: &str) -> Result<()> {
        self.client()?
            .set_container_label(id, key, Some(value))
            .map_err(asked)
    }
}
