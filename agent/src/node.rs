//! This node's side of a PodSnapshot, through containerd as chalkctl does it (blocking: the
//! agent runs it off its async runtime): the pod's sandbox found by its UID, snapshotted,
//! pushed, and deleted again.

use std::path::PathBuf;

use chalk_client::{
    containerd::Client,
    ops::snapshot,
    progress::Progress,
    records::snapshots,
    remote::{push, Access},
};

/// containerd's CRI namespace, where the kubelet's pods are.
pub const CRI_NAMESPACE: &str = "k8s.io";
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
const CRI_KIND_LABEL: &str = "io.cri-containerd.kind";
/// On a snapshot taken for a PodSnapshot: `namespace/name` of that PodSnapshot.
pub const POD_SNAPSHOT_LABEL: &str = "pod-snapshot";

/// How this node's containerd, runtime options and registries are reached.
#[derive(Clone)]
pub struct Node {
    pub address: String,
    /// The shim's runtime options (its snapshot store); None: the shim's default file.
    pub config: Option<PathBuf>,
    pub access: Access,
}

/// A snapshot stored on this node.
pub struct Taken {
    pub id: String,
    pub size: u64,
}

impl Node {
    fn client(&self) -> Result<Client, String> {
        let mut c = Client::connect(&self.address, CRI_NAMESPACE).map_err(|e| e.to_string())?;
        if let Some(p) = &self.config {
            c.set_config(p.clone());
        }
        Ok(c)
    }

    /// The running sandbox of pod `uid` on this node, if chalk-shim runs it.
    pub fn sandbox_of(&self, uid: &str) -> Result<Option<String>, String> {
        let client = self.client()?;
        let runtime = chalk_client::containerd::RUNTIME;
        let candidates: Vec<_> = client
            .containers()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|c| {
                c.labels.get(POD_UID_LABEL).map(String::as_str) == Some(uid)
                    && c.labels.get(CRI_KIND_LABEL).map(String::as_str) == Some("sandbox")
                    && c.runtime.as_ref().is_some_and(|r| r.name == runtime)
            })
            .collect();
        for c in candidates {
            if let Some((status, _)) = client.task_status(&c.id).map_err(|e| e.to_string())? {
                if status == "running" {
                    return Ok(Some(c.id));
                }
            }
        }
        Ok(None)
    }

    /// Snapshots sandbox `sandbox` in place (it runs on), labelled with its PodSnapshot.
    pub fn snapshot(&self, sandbox: &str, for_snapshot: &str) -> Result<Taken, String> {
        self.snapshot_labelled(sandbox, POD_SNAPSHOT_LABEL, for_snapshot)
    }

    /// Snapshots sandbox `sandbox` in place, the snapshot labelled `key`=`value`.
    pub fn snapshot_labelled(
        &self,
        sandbox: &str,
        key: &str,
        value: &str,
    ) -> Result<Taken, String> {
        let mut client = self.client()?;
        let labels = vec![(key.to_string(), value.to_string())];
        let snap = snapshot::create_named(
            &mut client,
            sandbox,
            labels,
            None,
            false,
            &Progress::quiet(),
        )
        .map_err(|e| e.to_string())?;
        let size = snapshots::stored_manifest(&client, &snap.index)
            .ok()
            .flatten()
            .map_or(0, |m| m.total_size());
        Ok(Taken {
            id: snap.digest,
            size,
        })
    }

    /// Pushes snapshot `id` to `reference`: what a pull names (`repo:tag@sha256:…`).
    pub fn push(&self, id: &str, reference: &str) -> Result<String, String> {
        let client = self.client()?;
        push::push(&client, &self.access, id, reference, &Progress::quiet())
            .map(|p| p.reference)
            .map_err(|e| e.to_string())
    }

    /// Arms, releases or kills (`verdict`) the shim's hold on pod sandbox `sandbox`'s stop.
    pub fn hold_stop(&self, sandbox: &str, verdict: &str) -> Result<(), String> {
        self.client()?
            .hold_stop(sandbox, verdict)
            .map_err(|e| e.to_string())
    }

    /// Removes the snapshots of `repository` beyond the newest `keep`: what was removed.
    pub fn prune(&self, repository: &str, keep: usize) -> Result<Vec<String>, String> {
        chalk_client::remote::prune::prune(&self.access, repository, keep)
            .map_err(|e| e.to_string())
    }

    /// Deletes snapshot `id` from this node; one that is not here is already gone.
    pub fn delete(&self, id: &str) -> Result<bool, String> {
        let client = self.client()?;
        let Ok(snap) = snapshots::find(&client, id) else {
            return Ok(false);
        };
        snapshots::delete(&client, &snap).map_err(|e| e.to_string())?;
        Ok(true)
    }

    /// Snapshots on this node taken or pulled for PodSnapshot `for_snapshot`.
    pub fn held_for(&self, for_snapshot: &str, id: Option<&str>) -> Result<Vec<String>, String> {
        let client = self.client()?;
        Ok(snapshots::all(&client)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|s| {
                s.labels.get(POD_SNAPSHOT_LABEL).map(String::as_str) == Some(for_snapshot)
                    || (id.is_some_and(|id| s.digest == id))
            })
            .map(|s| s.name)
            .collect())
    }
}
