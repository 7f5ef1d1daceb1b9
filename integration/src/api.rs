//! The few containerd API calls `ctr` 1.6 has no command for (Update) or hides (Wait's exit
//! time), made with containerd's own gRPC client.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use containerd_client::{
    services::v1::{
        containers_client::ContainersClient,
        leases_client::LeasesClient,
        snapshots::{snapshots_client::SnapshotsClient, MountsRequest},
        tasks_client::TasksClient,
        CheckpointTaskRequest, CreateRequest as CreateLeaseRequest, CreateTaskRequest,
        DeleteRequest as DeleteLeaseRequest, GetContainerRequest, ResizePtyRequest, StartRequest,
        UpdateTaskRequest, WaitRequest,
    },
    tonic::{transport::Channel, Request},
    types::Mount,
    with_namespace,
};

pub use containerd_client::types::Descriptor;

/// The media type of the checkpoint tar containerd stores for a task checkpoint.
pub const CHECKPOINT_TAR: &str = "application/vnd.containerd.container.criu.checkpoint.criu.tar";

/// A single-threaded runtime and a gRPC channel to containerd's socket (its API and its CRI
/// plugin listen on the same one).
pub fn grpc_channel(socket: &Path) -> Result<(tokio::runtime::Runtime, Channel), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let channel = rt
        .block_on(containerd_client::connect(socket))
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    Ok((rt, channel))
}

pub struct Api {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    namespace: String,
    lease: Option<String>,
}

impl Api {
    pub fn connect(socket: &Path, namespace: &str) -> Result<Self, String> {
        let (rt, channel) = grpc_channel(socket)?;
        Ok(Api {
            rt,
            channel,
            namespace: namespace.to_string(),
            lease: None,
        })
    }

    fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
    }

    /// Tasks.Update with annotations only (what the node agent sends chalk-shim).
    pub fn update_annotations(&self, id: &str, annotations: &[(&str, &str)]) -> Result<(), String> {
        let req = UpdateTaskRequest {
            container_id: id.to_string(),
            resources: None,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let req = with_namespace!(req, self.namespace);
        self.rt
            .block_on(self.tasks().update(req))
            .map(drop)
            .map_err(|e| format!("update of task {id}: {}", e.message()))
    }

    /// Tasks.Update with new Linux resources (the OCI `LinuxResources` JSON).
    pub fn update_resources(&self, id: &str, resources: &serde_json::Value) -> Result<(), String> {
        let req = UpdateTaskRequest {
            container_id: id.to_string(),
            resources: Some(prost_types::Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into(),
                value: serde_json::to_vec(resources).map_err(|e| e.to_string())?,
            }),
            annotations: Default::default(),
        };
        let req = with_namespace!(req, self.namespace);
        self.rt
            .block_on(self.tasks().update(req))
            .map(drop)
            .map_err(|e| e.message().to_string())
    }

    /// Tasks.ResizePty.
    pub fn resize_pty(
        &self,
        id: &str,
        exec_id: &str,
        width: u32,
        height: u32,
    ) -> Result<(), String> {
        let req = ResizePtyRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            width,
            height,
        };
        let req = with_namespace!(req, self.namespace);
        self.rt
            .block_on(self.tasks().resize_pty(req))
            .map(drop)
            .map_err(|e| e.message().to_string())
    }

    /// Tasks.Wait: the exit status and the time of the exit.
    pub fn wait(&self, id: &str, exec_id: &str) -> Result<(u32, SystemTime), String> {
        let req = WaitRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        };
        let req = with_namespace!(req, self.namespace);
        let resp = self
            .rt
            .block_on(self.tasks().wait(req))
            .map_err(|e| e.message().to_string())?
            .into_inner();
        let at = resp
            .exited_at
            .map(|t| SystemTime::UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos as u32))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok((resp.exit_status, at))
    }

    /// Tasks.Checkpoint into `dir` (the runc `CheckpointOptions` image_path); with `exit` the
    /// task stops after it (suspend). `ctr` 1.6 cannot say either for a non-runc runtime.
    pub fn checkpoint_to(&self, id: &str, dir: &Path, exit: bool) -> Result<(), String> {
        let mut value = Vec::new();
        if exit {
            value.extend_from_slice(&[0x08, 0x01]); // bool exit = 1
        }
        put_string(&mut value, 8, &dir.display().to_string()); // string image_path = 8
        let req = CheckpointTaskRequest {
            container_id: id.to_string(),
            parent_checkpoint: String::new(),
            options: Some(prost_types::Any {
                type_url: "containerd.runc.v1.CheckpointOptions".into(),
                value,
            }),
        };
        let req = with_namespace!(req, self.namespace);
        self.rt
            .block_on(self.tasks().checkpoint(req))
            .map(drop)
            .map_err(|e| e.message().to_string())
    }

    /// The rootfs mounts of existing container `id`, as the Go client gathers them for Create.
    fn rootfs_of(&self, id: &str) -> Result<Vec<Mount>, String> {
        rootfs_mounts(&self.rt, &self.channel, &self.namespace, id)
    }

    /// Tasks.Create for existing container `id` from a checkpoint, with no stdio: `checkpoint`
    /// is the checkpoint tar in the content store (what `ctr container restore` sends).
    pub fn create_task_from(&self, id: &str, checkpoint: &Descriptor) -> Result<(), String> {
        let req = CreateTaskRequest {
            container_id: id.to_string(),
            rootfs: self.rootfs_of(id)?,
            checkpoint: Some(checkpoint.clone()),
            ..Default::default()
        };
        self.rt
            .block_on(self.tasks().create(self.leased(req)))
            .map(drop)
            .map_err(|e| e.message().to_string())
    }

    /// Tasks.Checkpoint into the content store, under this client's lease; with `exit` the
    /// task stops after it (suspend, which `ctr` 1.6 cannot ask of a non-runc runtime).
    /// Returns the checkpoint tar's descriptor.
    pub fn checkpoint(&self, id: &str, exit: bool) -> Result<Descriptor, String> {
        let req = CheckpointTaskRequest {
            container_id: id.to_string(),
            parent_checkpoint: String::new(),
            options: Some(prost_types::Any {
                type_url: "containerd.runc.v1.CheckpointOptions".into(),
                value: if exit { vec![0x08, 0x01] } else { Vec::new() }, // bool exit = 1
            }),
        };
        let resp = self
            .rt
            .block_on(self.tasks().checkpoint(self.leased(req)))
            .map_err(|e| e.message().to_string())?
            .into_inner();
        resp.descriptors
            .into_iter()
            .find(|d| d.media_type == CHECKPOINT_TAR)
            .ok_or_else(|| "Checkpoint returned no checkpoint tar".to_string())
    }

    /// Creates the lease that keeps this client's checkpoints from containerd's garbage
    /// collector until [`Api::release`].
    pub fn lease(&mut self, id: &str) -> Result<(), String> {
        let req = CreateLeaseRequest {
            id: id.to_string(),
            labels: Default::default(),
        };
        self.rt
            .block_on(
                LeasesClient::new(self.channel.clone())
                    .create(with_namespace!(req, self.namespace)),
            )
            .map_err(|e| e.message().to_string())?;
        self.lease = Some(id.to_string());
        Ok(())
    }

    pub fn release(&mut self) {
        if let Some(id) = self.lease.take() {
            let req = DeleteLeaseRequest { id, sync: true };
            let _ = self.rt.block_on(
                LeasesClient::new(self.channel.clone())
                    .delete(with_namespace!(req, self.namespace)),
            );
        }
    }

    fn leased<T>(&self, msg: T) -> Request<T> {
        let mut req = with_namespace!(msg, self.namespace);
        if let Some(lease) = &self.lease {
            req.metadata_mut()
                .insert("containerd-lease", lease.parse().expect("ascii lease id"));
        }
        req
    }

    /// Tasks.Start of the init process.
    pub fn start(&self, id: &str) -> Result<u32, String> {
        let req = StartRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        };
        let req = with_namespace!(req, self.namespace);
        self.rt
            .block_on(self.tasks().start(req))
            .map(|r| r.into_inner().pid)
            .map_err(|e| e.message().to_string())
    }
}

/// The rootfs mounts of existing container `id` in `namespace`, from its snapshotter.
pub fn rootfs_mounts(
    rt: &tokio::runtime::Runtime,
    channel: &Channel,
    namespace: &str,
    id: &str,
) -> Result<Vec<Mount>, String> {
    let req = GetContainerRequest { id: id.to_string() };
    let container = rt
        .block_on(ContainersClient::new(channel.clone()).get(with_namespace!(req, namespace)))
        .map_err(|e| e.message().to_string())?
        .into_inner()
        .container
        .ok_or("no container in the answer")?;
    let req = MountsRequest {
        snapshotter: container.snapshotter.clone(),
        key: container.snapshot_key.clone(),
    };
    Ok(rt
        .block_on(SnapshotsClient::new(channel.clone()).mounts(with_namespace!(req, namespace)))
        .map_err(|e| e.message().to_string())?
        .into_inner()
        .mounts)
}

/// Appends a length-delimited protobuf field (short values only: one-byte length).
fn put_string(out: &mut Vec<u8>, field: u8, value: &str) {
    assert!(
        value.len() < 128,
        "long protobuf strings need a varint length"
    );
    out.push(field << 3 | 2);
    out.push(value.len() as u8);
    out.extend_from_slice(value.as_bytes());
}
