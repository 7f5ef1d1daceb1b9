//! Snapshotters: the root filesystems of forks and resumes, and layers applied to them.

use super::*;

impl Client {
    pub fn prepare_snapshot(&self, snapshotter: &str, key: &str, parent: &str) -> Result<()> {
        let req = self.req(PrepareSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
            parent: parent.to_string(),
            labels: HashMap::new(),
        });
        self.rt
            .block_on(SnapshotsClient::new(self.channel.clone()).prepare(req))
            .map(drop)
            .map_err(|e| describe(&format!("prepare the root filesystem of {key}"), e))
    }

    /// Whether snapshot `key` (a committed layer's chain id, say) exists in `snapshotter`.
    pub fn snapshot_exists(&self, snapshotter: &str, key: &str) -> Result<bool> {
        let req = self.req(StatSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        });
        let found = self
            .rt
            .block_on(SnapshotsClient::new(self.channel.clone()).stat(req));
        exists(found, &format!("look up snapshot {key}"))
    }

    /// A new active snapshot `key` on `parent`, and the mounts to write into it.
    pub fn prepare_mounts(&self, snapshotter: &str, key: &str, parent: &str) -> Result<Vec<Mount>> {
        let req = self.req(PrepareSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
            parent: parent.to_string(),
            labels: HashMap::new(),
        });
        self.rt
            .block_on(SnapshotsClient::new(self.channel.clone()).prepare(req))
            .map(|r| r.into_inner().mounts)
            .map_err(|e| describe(&format!("prepare snapshot {key}"), e))
    }

    pub fn commit_snapshot(&self, snapshotter: &str, name: &str, key: &str) -> Result<()> {
        let req = self.req(CommitSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            name: name.to_string(),
            key: key.to_string(),
            labels: HashMap::new(),
        });
        self.rt
            .block_on(SnapshotsClient::new(self.channel.clone()).commit(req))
            .map(drop)
            .map_err(|e| describe(&format!("commit snapshot {name}"), e))
    }

    /// Unpacks image layer `layer` (from the content store) onto `mounts` with containerd's
    /// own differ: the descriptor of what it applied (its uncompressed digest).
    pub fn apply_layer(&self, layer: &Descriptor, mounts: Vec<Mount>) -> Result<Descriptor> {
        let req = self.req(ApplyRequest {
            diff: Some(layer.clone()),
            mounts,
            payloads: HashMap::new(),
            sync_fs: false,
        });
        self.rt
            .block_on(DiffClient::new(self.channel.clone()).apply(req))
            .map_err(|e| describe(&format!("unpack layer {}", layer.digest), e))?
            .into_inner()
            .applied
            .ok_or_else(|| Error::from(format!("unpack layer {}: no answer", layer.digest)))
    }

    pub fn remove_snapshot(&self, snapshotter: &str, key: &str) {
        let req = self.req(RemoveSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        });
        let _ = self
            .rt
            .block_on(SnapshotsClient::new(self.channel.clone()).remove(req));
    }
}
