//! The containerd API calls chalkctl makes, blocking, over one connection. Every call runs in
//! the chosen namespace and, once a lease is taken, under it (so containerd's garbage
//! collector keeps what a half-finished command wrote).

use std::collections::HashMap;

use containerd_client::{
    services::v1::{
        container::Runtime,
        containers_client::ContainersClient,
        content_client::ContentClient,
        diff_client::DiffClient,
        images_client::ImagesClient,
        leases_client::LeasesClient,
        snapshots::{
            snapshots_client::SnapshotsClient, CommitSnapshotRequest, MountsRequest,
            PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
        },
        tasks_client::TasksClient,
        AddResourceRequest, ApplyRequest, CheckpointTaskRequest, CloseIoRequest, Container,
        CreateContainerRequest, CreateImageRequest, CreateRequest as CreateLease,
        CreateTaskRequest, DeleteContainerRequest, DeleteImageRequest, DeleteProcessRequest,
        DeleteRequest as DeleteLease, DeleteTaskRequest, ExecProcessRequest, GetContainerRequest,
        GetImageRequest, GetRequest as GetTaskRequest, Image, Info as ContentInfo,
        InfoRequest as ContentInfoRequest, KillRequest, ListContainersRequest, ListImagesRequest,
        ReadContentRequest, ResizePtyRequest, Resource as LeaseResource, StartRequest,
        UpdateContainerRequest, UpdateImageRequest, UpdateRequest as UpdateContentRequest,
        WaitRequest, WriteAction, WriteContentRequest,
    },
    tonic::{transport::Channel, Code, Request, Status},
    types::{Descriptor, Mount},
    with_namespace,
};

use crate::error::Error;
pub use crate::error::Result;
use chalk_runtime::snapshot::manifest::ImageRef;

/// Where a task's stdio goes: fifos (or files) its client owns, and whether its init has a
/// terminal (then stdout carries both output streams and stderr is empty).
#[derive(Debug, Clone, Default)]
pub struct Stdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

pub struct Client {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    namespace: String,
    lease: Option<String>,
    /// A lease of [`Client::under_own_lease`], for callers holding `&Client`.
    scoped_lease: std::sync::Mutex<Option<String>>,
    /// The shim's runtime options, which name the snapshot store it shares with chalkctl
    /// (else the ones the shim reads by default).
    config: Option<std::path::PathBuf>,
}

fn describe(what: &str, e: Status) -> Error {
    Error::containerd(what, e)
}

impl Client {
    pub fn connect(address: &str, namespace: &str) -> Result<Self> {
        // Two workers: `fork --count N` makes its forks from N threads sharing this client.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::from(format!("start a runtime: {e}")))?;
        let socket = address
            .strip_prefix("unix://")
            .unwrap_or(address)
            .to_string();
        let channel = rt
            .block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    containerd_client::connect(&socket),
                )
                .await
            })
            .map_err(|_| Error::from(format!("containerd at {socket} did not answer within 10 s")))?
            .map_err(|e| {
                format!("cannot reach containerd at {socket}: {e} (is it running? set --address or CONTAINERD_ADDRESS)")
            })?;
        Ok(Client {
            rt,
            channel,
            namespace: namespace.to_string(),
            lease: None,
            scoped_lease: Default::default(),
            config: None,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Reads the snapshot store's place from the runtime options at `path` (when it is needed).
    pub fn set_config(&mut self, path: std::path::PathBuf) {
        self.config = Some(path);
    }

    /// The shim's runtime options (`--config`, else the ones it reads by default).
    pub fn options(&self) -> Result<chalk_runtime::options::RuntimeOptions> {
        use chalk_runtime::options::RuntimeOptions;
        match &self.config {
            Some(path) => RuntimeOptions::load(path),
            None => RuntimeOptions::load_default(),
        }
        .map_err(|e| Error::from(e.to_string()))
    }

    /// The snapshot store the shim's `[snapshot] store` option names, opened (made if need be).
    pub fn store(&self) -> Result<chalk_runtime::snapshot::store::Store> {
        let opts = self.options()?;
        chalk_runtime::snapshot::store::Store::open(&opts.snapshot.store)
            .map_err(|e| Error::from(e.to_string()))
    }

    fn req<T>(&self, msg: T) -> Request<T> {
        let mut req = with_namespace!(msg, self.namespace);
        let scoped = self.scoped_lease.lock().unwrap().clone();
        if let Some(lease) = self.lease.as_ref().or(scoped.as_ref()) {
            if let Ok(v) = lease.parse() {
                req.metadata_mut().insert("containerd-lease", v);
            }
        }
        req
    }

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

    /// Tasks.Checkpoint with runc's `CheckpointOptions` (`exit` for suspend): the
    /// descriptors containerd stored (the checkpoint tar and the spec).
    /// Checkpoints task `id` (stopping it after, with `exit`) into `image_path`, a directory
    /// of the shim's choosing (containerd 2 then stores nothing; containerd 1.6 passes the
    /// option on but still stores what its own temporary directory holds: nothing), or else
    /// into containerd's content store.
    pub fn checkpoint(
        &self,
        id: &str,
        exit: bool,
        image_path: Option<&std::path::Path>,
    ) -> Result<Vec<Descriptor>> {
        // containerd.runc.v1.CheckpointOptions: bool exit = 1, string image_path = 8.
        let mut value = Vec::new();
        if exit {
            prost::encoding::bool::encode(1, &exit, &mut value);
        }
        if let Some(path) = image_path {
            prost::encoding::string::encode(8, &path.display().to_string(), &mut value);
        }
        let req = self.req(CheckpointTaskRequest {
            container_id: id.to_string(),
            parent_checkpoint: String::new(),
            options: Some(prost_types::Any {
                type_url: "containerd.runc.v1.CheckpointOptions".into(),
                value,
            }),
        });
        Ok(self
            .rt
            .block_on(TasksClient::new(self.channel.clone()).checkpoint(req))
            .map_err(|e| describe(&format!("checkpoint of {id}"), e))?
            .into_inner()
            .descriptors)
    }

    /// Stores `data` in the content store, labelled, and returns its descriptor.
    pub fn write_blob(
        &self,
        media_type: &str,
        data: Vec<u8>,
        labels: HashMap<String, String>,
    ) -> Result<Descriptor> {
        let digest = format!(
            "sha256:{}",
            chalk_runtime::snapshot::hash::sha256_hex(&data)
        );
        let size = data.len() as i64;
        // In pieces: containerd takes gRPC messages of 16 MiB at most.
        const PIECE: usize = 4 << 20;
        let pieces: Vec<&[u8]> = if data.is_empty() {
            vec![&[][..]]
        } else {
            data.chunks(PIECE).collect()
        };
        let last = pieces.len() - 1;
        // A ref of this writer's own: containerd locks a ref while it is written, and two
        // chalkctls may store the same blob at once (the second commit finds it there).
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let write_ref = format!("chalkctl-{digest}-{}-{n}", std::process::id());
        let messages: Vec<WriteContentRequest> = pieces
            .into_iter()
            .enumerate()
            .map(|(i, piece)| WriteContentRequest {
                action: if i == last {
                    WriteAction::Commit as i32
                } else {
                    WriteAction::Write as i32
                },
                r#ref: write_ref.clone(),
                total: size,
                expected: digest.clone(),
                offset: (i * PIECE) as i64,
                data: piece.to_vec(),
                labels: if i == last {
                    labels.clone()
                } else {
                    HashMap::new()
                },
            })
            .collect();
        let mut client = ContentClient::new(self.channel.clone());
        let req = self.req(tokio_stream::iter(messages));
        let written = self.rt.block_on(async {
            let mut stream = client.write(req).await?.into_inner();
            while stream.message().await?.is_some() {}
            Ok::<(), Status>(())
        });
        match written {
            Ok(()) => {}
            Err(e) if e.code() == Code::AlreadyExists => {}
            Err(e) => return Err(describe(&format!("store {digest}"), e)),
        }
        Ok(Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            annotations: HashMap::new(),
        })
    }

    /// Whether the content store holds blob `digest`.
    pub fn has_blob(&self, digest: &str) -> Result<bool> {
        let req = self.req(ContentInfoRequest {
            digest: digest.to_string(),
        });
        let found = self
            .rt
            .block_on(ContentClient::new(self.channel.clone()).info(req));
        exists(found, &format!("look up {digest}"))
    }

    /// Adds `labels` to blob `digest` (the others stay).
    pub fn label_blob(&self, digest: &str, labels: HashMap<String, String>) -> Result<()> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let req = self.req(UpdateContentRequest {
            info: Some(ContentInfo {
                digest: digest.to_string(),
                labels,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask { paths }),
        });
        self.rt
            .block_on(ContentClient::new(self.channel.clone()).update(req))
            .map(drop)
            .map_err(|e| describe(&format!("label {digest}"), e))
    }

    /// The whole of blob `digest`, checked against its digest: a snapshot is named by the
    /// digest of its index, and everything the index names is named by digest in turn.
    pub fn read_blob(&self, digest: &str) -> Result<Vec<u8>> {
        let data = self.read_range(digest, 0, 0)?;
        verify_digest(digest, &data)?;
        Ok(data)
    }

    /// `size` bytes of blob `digest` from `offset` (0: to the end); fewer at its end.
    pub fn read_range(&self, digest: &str, offset: u64, size: u64) -> Result<Vec<u8>> {
        let req = self.req(ReadContentRequest {
            digest: digest.to_string(),
            offset: offset as i64,
            size: size as i64,
        });
        let mut client = ContentClient::new(self.channel.clone());
        self.rt
            .block_on(async {
                let mut stream = client.read(req).await?.into_inner();
                let mut out = Vec::new();
                while let Some(chunk) = stream.message().await? {
                    out.extend_from_slice(&chunk.data);
                }
                Ok::<_, Status>(out)
            })
            .map_err(|e| describe(&format!("read {digest}"), e))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.release();
    }
}

impl Client {
    /// A new snapshot `key` of `snapshotter` on top of `parent` (an image's chain id).
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

    /// Creates the task of container `c` (from `checkpoint`, if given) and starts it: its pid.
    pub fn start_task(&self, c: &Container, checkpoint: Option<&Descriptor>) -> Result<u32> {
        // A sandbox whose init has a terminal keeps one (with no client attached, the shim
        // drains it): its processes were made on a terminal and go on expecting one.
        let terminal = crate::sandboxes::spec_of(c)["process"]["terminal"]
            .as_bool()
            .unwrap_or(false);
        let io = Stdio {
            terminal,
            ..Default::default()
        };
        self.start_task_with(c, checkpoint, &io, None)
    }

    /// As [`Client::start_task`], with the task's stdio attached to `io`, and its terminal
    /// given `size` (columns, rows) between Create and Start: a restored shell's first
    /// prompt is then drawn for the window it is in.
    pub fn start_task_with(
        &self,
        c: &Container,
        checkpoint: Option<&Descriptor>,
        io: &Stdio,
        size: Option<(u32, u32)>,
    ) -> Result<u32> {
        let req = self.req(MountsRequest {
            snapshotter: c.snapshotter.clone(),
            key: c.snapshot_key.clone(),
        });
        let mounts = self
            .rt
            .block_on(SnapshotsClient::new(self.channel.clone()).mounts(req))
            .map_err(|e| describe(&format!("root filesystem of {}", c.id), e))?
            .into_inner()
            .mounts;
        let req = self.req(CreateTaskRequest {
            container_id: c.id.clone(),
            rootfs: mounts,
            checkpoint: checkpoint.cloned(),
            terminal: io.terminal,
            stdin: io.stdin.clone(),
            stdout: io.stdout.clone(),
            stderr: io.stderr.clone(),
            ..Default::default()
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).create(req))
            .map_err(|e| describe(&format!("create the task of {}", c.id), e))?;
        if let Some((cols, rows)) = size {
            self.resize_pty(&c.id, cols, rows)?;
        }
        let req = self.req(StartRequest {
            container_id: c.id.clone(),
            exec_id: String::new(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).start(req))
            .map(|r| r.into_inner().pid)
            .map_err(|e| describe(&format!("start {}", c.id), e))
    }

    /// Sets the window size of the terminal of sandbox `id`'s init.
    pub fn resize_pty(&self, id: &str, cols: u32, rows: u32) -> Result<()> {
        self.resize_process(id, "", cols, rows)
    }

    /// Sets the window size of the terminal of process `exec_id` of sandbox `id` (its init
    /// when empty).
    pub fn resize_process(&self, id: &str, exec_id: &str, cols: u32, rows: u32) -> Result<()> {
        let req = self.req(ResizePtyRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            width: cols,
            height: rows,
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).resize_pty(req))
            .map(drop)
            .map_err(|e| describe(&format!("resize the terminal of {id}"), e))
    }

    /// Adds process `exec_id` to sandbox `id`, `process` its OCI process spec, on `io`.
    pub fn exec(
        &self,
        id: &str,
        exec_id: &str,
        process: &serde_json::Value,
        io: &Stdio,
    ) -> Result<()> {
        let req = self.req(ExecProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            stdin: io.stdin.clone(),
            stdout: io.stdout.clone(),
            stderr: io.stderr.clone(),
            terminal: io.terminal,
            spec: Some(prost_types::Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
                value: serde_json::to_vec(process).map_err(|e| Error::from(e.to_string()))?,
            }),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).exec(req))
            .map(drop)
            .map_err(|e| describe(&format!("exec in {id}"), e))
    }

    /// Starts process `exec_id` of sandbox `id`: its pid.
    pub fn start_process(&self, id: &str, exec_id: &str) -> Result<u32> {
        let req = self.req(StartRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).start(req))
            .map(|r| r.into_inner().pid)
            .map_err(|e| describe(&format!("start {exec_id} in {id}"), e))
    }

    /// Waits for process `exec_id` of sandbox `id` to exit: its exit status.
    pub fn wait_process(&self, id: &str, exec_id: &str) -> Result<u32> {
        let req = self.req(WaitRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).wait(req))
            .map(|r| r.into_inner().exit_status)
            .map_err(|e| describe(&format!("wait for {exec_id} in {id}"), e))
    }

    /// Sends `signal` to process `exec_id` of sandbox `id` (its init when empty; every
    /// process of the sandbox with `all`).
    pub fn kill(&self, id: &str, exec_id: &str, signal: i32, all: bool) -> Result<()> {
        let req = self.req(KillRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            signal: signal as u32,
            all,
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).kill(req))
            .map(drop)
            .map_err(|e| describe(&format!("signal {signal} to {id}"), e))
    }

    /// Closes the stdin of process `exec_id` of sandbox `id`.
    pub fn close_stdin(&self, id: &str, exec_id: &str) -> Result<()> {
        let req = self.req(CloseIoRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            stdin: true,
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).close_io(req))
            .map(drop)
            .map_err(|e| describe(&format!("close the stdin of {exec_id} in {id}"), e))
    }

    /// Removes exited process `exec_id` of sandbox `id`.
    pub fn delete_process(&self, id: &str, exec_id: &str) -> Result<()> {
        let req = self.req(DeleteProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).delete_process(req))
            .map(drop)
            .map_err(|e| describe(&format!("remove {exec_id} of {id}"), e))
    }

    /// Waits for the init of sandbox `id` to exit: its exit status (None when it has no task).
    pub fn wait(&self, id: &str) -> Result<Option<u32>> {
        let req = self.req(WaitRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        });
        match self
            .rt
            .block_on(TasksClient::new(self.channel.clone()).wait(req))
        {
            Ok(r) => Ok(Some(r.into_inner().exit_status)),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(describe(&format!("wait for {id}"), e)),
        }
    }

    /// The task's status (`running`, `paused`, `created`, `stopped`) and pid; None without
    /// a task.
    pub fn task_status(&self, id: &str) -> Result<Option<(String, u32)>> {
        let req = self.req(GetTaskRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        });
        match self
            .rt
            .block_on(TasksClient::new(self.channel.clone()).get(req))
        {
            Ok(resp) => Ok(resp.into_inner().process.map(|p| {
                let status = containerd_client::types::v1::Status::try_from(p.status)
                    .map_or("unknown".to_string(), |s| s.as_str_name().to_lowercase());
                (status, p.pid)
            })),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(describe(&format!("task of {id}"), e)),
        }
    }

    pub fn delete_task(&self, id: &str) {
        let _ = self.try_delete_task(id);
    }

    /// Ends a task that may be running (SIGKILL to all its processes), then deletes it:
    /// undoing a fork that got part of the way. Tried for up to 30 s (containerd may be
    /// restarting, or the task still starting): whether the task is gone. A container whose
    /// task could not be removed must be kept (containerd would delete its record and leave
    /// the task running with no container).
    pub fn kill_and_delete_task(&self, id: &str) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if self.try_delete_task(id).is_ok() || matches!(self.task_status(id), Ok(None)) {
                return true;
            }
            let req = self.req(KillRequest {
                container_id: id.to_string(),
                signal: libc::SIGKILL as u32,
                all: true,
                ..Default::default()
            });
            let _ = self
                .rt
                .block_on(TasksClient::new(self.channel.clone()).kill(req));
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn try_delete_task(&self, id: &str) -> std::result::Result<(), Status> {
        let req = self.req(DeleteTaskRequest {
            container_id: id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).delete(req))
            .map(drop)
    }

    /// Deletes the task of a sandbox that has just stopped, waiting (up to 10 s) for
    /// containerd to have taken in its exit: until then it refuses to delete a running task.
    pub fn delete_stopped_task(&self, id: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match self.try_delete_task(id) {
                Ok(()) => return Ok(()),
                Err(e) if e.code() == Code::NotFound => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(describe(&format!("delete the stopped task of {id}"), e))
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
    }
}

/// A lookup's answer as whether the thing exists (containerd says NotFound when it does not).
fn exists<T>(found: std::result::Result<T, Status>, what: &str) -> Result<bool> {
    match found {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Code::NotFound => Ok(false),
        Err(e) => Err(describe(what, e)),
    }
}

/// Refuses `data` unless it hashes to `digest` (`sha256:` digests; others are not made here).
pub fn verify_digest(digest: &str, data: &[u8]) -> Result<()> {
    let Some(expected) = digest.strip_prefix("sha256:") else {
        return Err(format!("{digest}: only sha256 digests are supported").into());
    };
    let actual = chalk_runtime::snapshot::hash::sha256_hex(data);
    if actual != expected {
        return Err(format!(
            "{digest} does not verify: its content in containerd's store hashes to sha256:{actual}; \
             the store was changed or damaged: delete what uses it and store it again"
        ).into());
    }
    Ok(())
}

/// The runtime a sandbox runs with.
pub fn runtime_name(c: &Container) -> &str {
    c.runtime.as_ref().map_or("", |r: &Runtime| r.name.as_str())
}

fn expire_in(secs: u64) -> String {
    let at = std::time::SystemTime::now() + std::time::Duration::from_secs(secs);
    let secs = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    chalk_runtime::snapshot::manifest::rfc3339_at(secs)
}

#[cfg(test)]
mod tests {
    use super::verify_digest;

    #[test]
    fn blobs_must_hash_to_their_digest() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(verify_digest(empty, b"").is_ok());
        let err = verify_digest(empty, b"x").unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");
        assert!(verify_digest("md5:00", b"").is_err());
    }
}
