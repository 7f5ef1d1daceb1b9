//! This node's side of a PodSnapshot, through containerd as chalkctl does it (blocking: the
//! agent runs it off its async runtime): the pod's sandbox found by its UID, snapshotted,
//! pushed, and deleted again. Deletes match a record by its full digest and whose copy it
//! is (the store's ref of it): a copy pulled for another namespace is never touched.

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

    /// The shim's runtime options on this node (where pods may restore from and push to).
    pub fn options(&self) -> Result<chalk_runtime::options::RuntimeOptions, String> {
        self.client()?.options().map_err(|e| e.to_string())
    }

    /// Snapshots sandbox `sandbox` in place (it runs on), labelled with its PodSnapshot.
    pub fn snapshot(&self, sandbox: &str, for_snapshot: &str) -> Result<Taken, String> {
        self.snapshot_labelled(sandbox, POD_SNAPSHOT_LABEL, for_snapshot, None)
    }

    /// Snapshots sandbox `sandbox` in place, the snapshot labelled `key`=`value`, its owner
    /// recorded as the agent-sandbox Sandbox `of_sandbox` (or none).
    pub fn snapshot_labelled(
        &self,
        sandbox: &str,
        key: &str,
        value: &str,
        of_sandbox: Option<&str>,
    ) -> Result<Taken, String> {
        let mut client = self.client()?;
        // The shim records this in the snapshot's owner: written by the agent just before
        // each snapshot it takes, whatever a pod's own labels put there.
        client
            .set_container_label(
                sandbox,
                chalk_labels::OWNER_SANDBOX_LABEL,
                Some(of_sandbox.unwrap_or("")),
            )
            .map_err(|e| e.to_string())?;
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

    /// Deletes this node's record of snapshot `id` (its full digest) that the agent took
    /// (it carries `key`=`value`); one that is not here is already gone.
    pub fn delete_taken(&self, id: &str, key: &str, value: &str) -> Result<bool, String> {
        let client = self.client()?;
        let mine = snapshots::all(&client)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|s| s.digest == id && s.labels.get(key).map(String::as_str) == Some(value));
        let mut gone = false;
        for snap in mine {
            snapshots::delete(&client, &snap).map_err(|e| e.to_string())?;
            gone = true;
        }
        Ok(gone)
    }

    /// Deletes the copies on this node pulled from `repository` (a Sandbox's own) for pods
    /// of namespace `namespace`: how many.
    pub fn delete_pulled_from(&self, repository: &str, namespace: &str) -> Result<usize, String> {
        let client = self.client()?;
        let store = client.store().map_err(|e| e.to_string())?;
        let mut gone = 0;
        for snap in snapshots::all(&client).map_err(|e| e.to_string())? {
            let from = snap
                .labels
                .get(chalk_client::records::registry::PULLED_FROM);
            let same_repo = from.is_some_and(|f| same_repository(f, repository));
            if same_repo && owned_by(&store, client.namespace(), &snap.name, namespace) {
                snapshots::delete(&client, &snap).map_err(|e| e.to_string())?;
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// The copies on this node pulled from a registry: (record, reference pulled from, the
    /// Kubernetes namespace it was pulled for).
    pub fn pulled_copies(&self) -> Result<Vec<(String, String, Option<String>)>, String> {
        let client = self.client()?;
        let store = client.store().map_err(|e| e.to_string())?;
        Ok(snapshots::all(&client)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter_map(|s| {
                let from = s
                    .labels
                    .get(chalk_client::records::registry::PULLED_FROM)?
                    .clone();
                let token =
                    chalk_runtime::snapshot::store::Store::token(client.namespace(), &s.name);
                let of = store
                    .find_ref(&token)
                    .and_then(|r| r.owner)
                    .and_then(|o| o.pod_namespace().map(String::from));
                Some((s.name, from, of))
            })
            .collect())
    }

    /// Snapshots on this node taken for PodSnapshot `for_snapshot` (of namespace
    /// `namespace`), or copies of its snapshot `id` (full digest) pulled for that namespace.
    pub fn held_for(
        &self,
        for_snapshot: &str,
        namespace: &str,
        id: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let client = self.client()?;
        let store = client.store().map_err(|e| e.to_string())?;
        Ok(snapshots::all(&client)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|s| {
                s.labels.get(POD_SNAPSHOT_LABEL).map(String::as_str) == Some(for_snapshot)
                    || (id.is_some_and(|id| s.digest == id)
                        && owned_by(&store, client.namespace(), &s.name, namespace))
            })
            .map(|s| s.name)
            .collect())
    }

    /// Deletes this node's snapshot record `name` (as [`Node::held_for`] names them).
    pub fn delete(&self, name: &str) -> Result<bool, String> {
        let client = self.client()?;
        let Ok(snap) = snapshots::find_exact(&client, name) else {
            return Ok(false);
        };
        snapshots::delete(&client, &snap).map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// Whether the store's copy behind record `name` (of containerd namespace `ctrd`) belongs to
/// pods of Kubernetes namespace `namespace`.
fn owned_by(
    store: &chalk_runtime::snapshot::store::Store,
    ctrd: &str,
    name: &str,
    namespace: &str,
) -> bool {
    let token = chalk_runtime::snapshot::store::Store::token(ctrd, name);
    store
        .find_ref(&token)
        .and_then(|r| r.owner)
        .is_some_and(|o| o.pod_namespace() == Some(namespace))
}

/// Whether reference `pulled` (`repo[:tag]@digest`) is of repository `repository`.
fn same_repository(pulled: &str, repository: &str) -> bool {
    chalk_runtime::snapshot::signature::same_repository(pulled, repository)
}
