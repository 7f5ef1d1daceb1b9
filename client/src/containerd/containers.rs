//! Container records: read, create, label, delete.

use super::*;
use serde_json::Value;

impl Client {
    pub fn container(&self, id: &str) -> Result<Container> {
        let req = self.req(GetContainerRequest { id: id.to_string() });
        self.rt
            .block_on(ContainersClient::new(self.channel.clone()).get(req))
            .map_err(|e| describe(&format!("sandbox {id}"), e))?
            .into_inner()
            .container
            .ok_or_else(|| Error::from(format!("sandbox {id}: empty answer")))
    }

    /// Sets annotation `key` in the container record's spec (not the running sandbox's).
    pub fn mark_spec(&self, c: &Container, key: &str, value: &str) -> Result<()> {
        let mut c = c.clone();
        let id = c.id.clone();
        let spec = c
            .spec
            .as_mut()
            .ok_or_else(|| Error::from(format!("sandbox {id} has no spec")))?;
        let mut parsed: serde_json::Value = serde_json::from_slice(&spec.value)
            .map_err(|e| Error::from(format!("spec of sandbox {id}: {e}")))?;
        if !parsed["annotations"].is_object() {
            parsed["annotations"] = serde_json::json!({});
        }
        parsed["annotations"][key] = value.into();
        spec.value = serde_json::to_vec(&parsed).map_err(|e| Error::from(e.to_string()))?;
        self.update_container(c, "spec")
    }

    /// Writes `field` of container record `c` back to containerd.
    fn update_container(&self, c: Container, field: &str) -> Result<()> {
        let id = c.id.clone();
        let req = self.req(UpdateContainerRequest {
            container: Some(c),
            update_mask: Some(prost_types::FieldMask {
                paths: vec![field.into()],
            }),
        });
        self.rt
            .block_on(ContainersClient::new(self.channel.clone()).update(req))
            .map(drop)
            .map_err(|e| describe(&format!("update the {field} of sandbox {id}"), e))
    }

    /// Sets (Some) or removes (None) label `key` on the container record, and only that label
    /// (the shim sets others, such as the lifetime's end, at the same time).
    pub fn set_container_label(&self, id: &str, key: &str, value: Option<&str>) -> Result<()> {
        let mut c = self.container(id)?;
        match value {
            Some(v) => c.labels.insert(key.to_string(), v.to_string()),
            None => c.labels.remove(key),
        };
        self.update_container(c, &format!("labels.{key}"))
    }

    /// The image container `id` runs: its name and the digest that name points at now (a
    /// reference pinned by digest names its own); None when it was made without one (e.g.
    /// `ctr run --rootfs`). Spec annotations cannot tell: `ctr` and the Go client put no image
    /// in the spec.
    pub fn image_of(&self, id: &str) -> Result<Option<ImageRef>> {
        let container = self.container(id)?;
        if container.image.is_empty() {
            return Ok(None);
        }
        if let Some((_, digest)) = ImageRef::pinned(&container.image) {
            return Ok(Some(ImageRef {
                digest: digest.to_string(),
                name: container.image,
            }));
        }
        let digest = self
            .image(&container.image)?
            .target
            .map(|t| t.digest)
            .unwrap_or_default();
        Ok(Some(ImageRef {
            name: container.image,
            digest,
        }))
    }

    pub fn containers(&self) -> Result<Vec<Container>> {
        let req = self.req(ListContainersRequest::default());
        Ok(self
            .rt
            .block_on(ContainersClient::new(self.channel.clone()).list(req))
            .map_err(|e| describe("list sandboxes", e))?
            .into_inner()
            .containers)
    }

    pub fn create_container(&self, c: Container) -> Result<()> {
        let id = c.id.clone();
        let req = self.req(CreateContainerRequest { container: Some(c) });
        self.rt
            .block_on(ContainersClient::new(self.channel.clone()).create(req))
            .map(drop)
            .map_err(|e| describe(&format!("create sandbox {id}"), e))
    }

    pub fn delete_container(&self, id: &str) {
        let req = self.req(DeleteContainerRequest { id: id.to_string() });
        let _ = self
            .rt
            .block_on(ContainersClient::new(self.channel.clone()).delete(req));
    }
}

/// The spec of a container record (Null when it has none or it is not JSON).
pub fn spec_of(c: &Container) -> Value {
    c.spec
        .as_ref()
        .and_then(|s| serde_json::from_slice(&s.value).ok())
        .unwrap_or(Value::Null)
}
