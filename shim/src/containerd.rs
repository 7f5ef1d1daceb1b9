//! The shim's own calls to containerd's API, over the address it was started with: the
//! image a container was made from (a snapshot records it, name and digest; a restore
//! refuses an image whose name now points at another digest; spec annotations cannot tell,
//! as `ctr` and the Go client put no image in the spec), and a label on a container record
//! (when its lifetime ends).

use chalk_runtime::snapshot::manifest::ImageRef;
use containerd_client::{
    services::v1::{
        containers_client::ContainersClient, images_client::ImagesClient, GetContainerRequest,
        GetImageRequest, UpdateContainerRequest,
    },
    tonic::{transport::Channel, Request},
    with_namespace,
};

use crate::errors::{Result, ShimError};

/// Runs `f` over a connection to containerd at `address` (`unix://PATH` or a path).
fn with_containerd<T>(
    address: &str,
    f: impl AsyncFnOnce(Channel, &dyn Fn(&str, &dyn std::fmt::Display) -> ShimError) -> Result<T>,
) -> Result<T> {
    let socket = address.strip_prefix("unix://").unwrap_or(address);
    if socket.is_empty() {
        return Err(ShimError::FailedPrecondition(
            "the shim was not given containerd's address: cannot ask containerd".into(),
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ShimError::internal("start a runtime for containerd's API", e))?;
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        ShimError::Internal(format!("ask containerd ({socket}) for {what}: {e}"))
    };
    rt.block_on(async {
        let channel = containerd_client::connect(socket)
            .await
            .map_err(|e| failed("a connection", &e))?;
        f(channel, &failed).await
    })
}

/// The image of container `id`, None when it was made without one (e.g. `ctr run --rootfs`).
pub fn image_of(address: &str, namespace: &str, id: &str) -> Result<Option<ImageRef>> {
    with_containerd(address, async |channel, failed| {
        let req = GetContainerRequest { id: id.to_string() };
        let container = ContainersClient::new(channel.clone())
            .get(with_namespace!(req, namespace))
            .await
            .map_err(|e| failed(&format!("container {id}"), &e.message()))?
            .into_inner()
            .container
            .ok_or_else(|| failed(&format!("container {id}"), &"empty answer"))?;
        if container.image.is_empty() {
            return Ok(None);
        }
        // A reference pinned by digest names its image by itself (what a restore by digest,
        // e.g. chalkctl's fork, records), whatever tags say now.
        if let Some((_, digest)) = ImageRef::pinned(&container.image) {
            return Ok(Some(ImageRef {
                name: container.image.clone(),
                digest: digest.to_string(),
            }));
        }
        let req = GetImageRequest {
            name: container.image.clone(),
        };
        let image = ImagesClient::new(channel)
            .get(with_namespace!(req, namespace))
            .await
            .map_err(|e| failed(&format!("image {}", container.image), &e.message()))?
            .into_inner()
            .image
            .ok_or_else(|| failed(&format!("image {}", container.image), &"empty answer"))?;
        let digest = image.target.map(|t| t.digest).unwrap_or_default();
        Ok(Some(ImageRef {
            name: container.image,
            digest,
        }))
    })
}

/// Sets label `key` of container record `id` to `value`, touching no other label.
pub fn set_label(address: &str, namespace: &str, id: &str, key: &str, value: &str) -> Result<()> {
    with_containerd(address, async |channel, failed| {
        let mut container = containerd_client::services::v1::Container {
            id: id.to_string(),
            ..Default::default()
        };
        container.labels.insert(key.to_string(), value.to_string());
        let req = UpdateContainerRequest {
            container: Some(container),
            update_mask: Some(prost_types::FieldMask {
                paths: vec![format!("labels.{key}")],
            }),
        };
        ContainersClient::new(channel)
            .update(with_namespace!(req, namespace))
            .await
            .map(drop)
            .map_err(|e| failed(&format!("label {key} of container {id}"), &e.message()))
    })
}
