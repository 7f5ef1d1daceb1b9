//! Images (chalk's snapshot records are images too).

use super::*;

impl Client {
    pub fn image(&self, name: &str) -> Result<Image> {
        let req = self.req(GetImageRequest {
            name: name.to_string(),
        });
        self.rt
            .block_on(ImagesClient::new(self.channel.clone()).get(req))
            .map_err(|e| describe(&format!("image {name}"), e))?
            .into_inner()
            .image
            .ok_or_else(|| Error::from(format!("image {name}: empty answer")))
    }

    /// Images whose labels match containerd's filter syntax (e.g. `labels."k"==v`).
    pub fn images(&self, filter: &str) -> Result<Vec<Image>> {
        let req = self.req(ListImagesRequest {
            filters: vec![filter.to_string()],
        });
        Ok(self
            .rt
            .block_on(ImagesClient::new(self.channel.clone()).list(req))
            .map_err(|e| describe("list images", e))?
            .into_inner()
            .images)
    }

    pub fn create_image(&self, image: Image) -> Result<()> {
        let name = image.name.clone();
        let req = self.req(CreateImageRequest {
            image: Some(image),
            source_date_epoch: None,
        });
        self.rt
            .block_on(ImagesClient::new(self.channel.clone()).create(req))
            .map(drop)
            .map_err(|e| describe(&format!("create image {name}"), e))
    }

    /// Replaces the record's target and labels.
    pub fn update_image(&self, image: Image) -> Result<()> {
        let name = image.name.clone();
        let req = self.req(UpdateImageRequest {
            image: Some(image),
            update_mask: None,
            source_date_epoch: None,
        });
        self.rt
            .block_on(ImagesClient::new(self.channel.clone()).update(req))
            .map(drop)
            .map_err(|e| describe(&format!("update image {name}"), e))
    }

    pub fn delete_image(&self, name: &str) -> Result<()> {
        let req = self.req(DeleteImageRequest {
            name: name.to_string(),
            sync: false,
            target: None,
        });
        self.rt
            .block_on(ImagesClient::new(self.channel.clone()).delete(req))
            .map(drop)
            .map_err(|e| describe(&format!("delete image {name}"), e))
    }
}
