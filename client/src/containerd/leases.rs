//! Leases: what keeps a half-finished command's content and snapshots from containerd's
//! garbage collector.

use super::*;

impl Client {
    /// Takes a lease that expires by itself after an hour, should chalkctl die holding it.
    /// One taken before goes first: each step of a command (a pull, then a restore) has made
    /// what it protected reachable from a record by the time the next begins.
    pub fn lease(&mut self, id: &str) -> Result<()> {
        self.release();
        self.create_lease(id)?;
        self.lease = Some(id.to_string());
        Ok(())
    }

    /// Creates lease `id`, expiring by itself after an hour.
    fn create_lease(&self, id: &str) -> Result<()> {
        let mut labels = HashMap::new();
        labels.insert("containerd.io/gc.expire".to_string(), expire_in(3600));
        let req = self.req(CreateLease {
            id: id.to_string(),
            labels,
        });
        self.rt
            .block_on(LeasesClient::new(self.channel.clone()).create(req))
            .map_err(|e| describe("create a lease", e))?;
        Ok(())
    }

    /// Adds `id` of `kind` (`content`, `snapshots/<snapshotter>`) to the lease this client
    /// holds, so that containerd's garbage collector keeps it while the command works (it may
    /// belong to another command that fails meanwhile); nothing without a lease.
    pub fn hold(&self, kind: &str, id: &str) -> Result<()> {
        let Some(lease) = &self.lease else {
            return Ok(());
        };
        let req = self.req(AddResourceRequest {
            id: lease.clone(),
            resource: Some(LeaseResource {
                id: id.to_string(),
                r#type: kind.to_string(),
            }),
        });
        self.rt
            .block_on(LeasesClient::new(self.channel.clone()).add_resource(req))
            .map(drop)
            .map_err(|e| describe(&format!("hold {id} in the lease"), e))
    }

    /// Deletes lease `id` (one a dead chalkctl left), if it exists.
    pub fn delete_lease(&self, id: &str) {
        let req = self.req(DeleteLease {
            id: id.to_string(),
            sync: false,
        });
        let _ = self
            .rt
            .block_on(LeasesClient::new(self.channel.clone()).delete(req));
    }

    /// Runs `f` with what it writes held by a lease of its own (`id`), removed afterwards:
    /// content written is never collected before a record refers to it.
    pub fn under_own_lease<T>(&self, id: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.create_lease(id)?;
        *self.scoped_lease.lock().unwrap() = Some(id.to_string());
        let out = f();
        *self.scoped_lease.lock().unwrap() = None;
        self.delete_lease(id);
        out
    }

    pub fn release(&mut self) {
        if let Some(id) = self.lease.take() {
            let req = self.req(DeleteLease { id, sync: false });
            let _ = self
                .rt
                .block_on(LeasesClient::new(self.channel.clone()).delete(req));
        }
    }
}
