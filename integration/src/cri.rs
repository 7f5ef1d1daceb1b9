//! A client of containerd's CRI gRPC API (Kubernetes' runtime interface), for the pod tests:
//! what the kubelet asks of a runtime, asked the way the kubelet asks it.

use std::{collections::HashMap, path::Path, sync::Mutex, time::Duration};

use containerd_client::tonic::{transport::Channel, Request};
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerStats, ContainerStatsRequest,
    ContainerStatus, ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainersRequest, ListImagesRequest,
    ListPodSandboxRequest, NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    PodSandboxStatusRequest, RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};

pub use k8s_cri::v1::ContainerState;

/// What an ExecSync returned.
#[derive(Debug)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub struct Cri {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    /// Each pod's config: CreateContainer sends it again, as the kubelet does.
    pods: Mutex<HashMap<String, PodSandboxConfig>>,
}

impl Cri {
    pub fn connect(socket: &Path) -> Result<Self, String> {
        let (rt, channel) = crate::api::grpc_channel(socket)?;
        Ok(Cri {
            rt,
            channel,
            pods: Mutex::default(),
        })
    }

    fn client(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    fn call<T, F>(&self, what: &str, f: F) -> Result<T, String>
    where
        F: std::future::Future<
            Output = Result<
                containerd_client::tonic::Response<T>,
                containerd_client::tonic::Status,
            >,
        >,
    {
        self.rt
            .block_on(f)
            .map(|r| r.into_inner())
            .map_err(|s| format!("{what}: {} ({:?})", s.message(), s.code()))
    }

    /// RunPodSandbox with `handler`; a host-network pod unless `pod_network` (then the CNI
    /// network gives it its own). Returns the pod sandbox id.
    pub fn run_pod(&self, name: &str, handler: &str, pod_network: bool) -> Result<String, String> {
        self.run_pod_with(name, handler, pod_network, "default", &[])
    }

    /// As [`Cri::run_pod`], in Kubernetes namespace `namespace`, with pod `annotations`.
    pub fn run_pod_with(
        &self,
        name: &str,
        handler: &str,
        pod_network: bool,
        namespace: &str,
        annotations: &[(&str, &str)],
    ) -> Result<String, String> {
        let network = if pod_network {
            NamespaceMode::Pod
        } else {
            NamespaceMode::Node
        };
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: namespace.into(),
                attempt: 0,
            }),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            hostname: name.into(),
            log_directory: std::env::temp_dir()
                .join(format!("chalk-cri-logs-{name}"))
                .display()
                .to_string(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: network as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // The kubelet makes the pod's log directory; containerd writes container logs in it.
        std::fs::create_dir_all(&config.log_directory)
            .map_err(|e| format!("create {}: {e}", config.log_directory))?;
        let client = &mut self.client();
        let resp = self.call(
            "RunPodSandbox",
            client.run_pod_sandbox(Request::new(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })),
        )?;
        self.pods
            .lock()
            .unwrap()
            .insert(resp.pod_sandbox_id.clone(), config);
        Ok(resp.pod_sandbox_id)
    }

    /// The pod's log directory (container logs are files in it).
    pub fn log_directory(&self, pod: &str) -> Option<String> {
        self.pods
            .lock()
            .unwrap()
            .get(pod)
            .map(|c| c.log_directory.clone())
    }

    /// CreateContainer in `pod` running `command` in `image`; its log goes to `<name>.log` in
    /// the pod's log directory.
    pub fn create_container(
        &self,
        pod: &str,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> Result<String, String> {
        let sandbox_config = self.pods.lock().unwrap().get(pod).cloned();
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(Default::default()),
            ..Default::default()
        };
        let client = &mut self.client();
        self.call(
            "CreateContainer",
            client.create_container(Request::new(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config,
            })),
        )
        .map(|r| r.container_id)
    }

    pub fn start_container(&self, id: &str) -> Result<(), String> {
        let client = &mut self.client();
        self.call(
            "StartContainer",
            client.start_container(Request::new(StartContainerRequest {
                container_id: id.into(),
            })),
        )
        .map(drop)
    }

    /// CreateContainer then StartContainer.
    pub fn run_container(
        &self,
        pod: &str,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> Result<String, String> {
        let id = self.create_container(pod, name, image, command)?;
        self.start_container(&id)?;
        Ok(id)
    }

    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: Duration,
    ) -> Result<ExecResult, String> {
        let client = &mut self.client();
        let r = self.call(
            "ExecSync",
            client.exec_sync(Request::new(ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: timeout.as_secs() as i64,
            })),
        )?;
        Ok(ExecResult {
            exit_code: r.exit_code,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
        })
    }

    pub fn container_status(&self, id: &str) -> Result<ContainerStatus, String> {
        let client = &mut self.client();
        self.call(
            "ContainerStatus",
            client.container_status(Request::new(ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })),
        )?
        .status
        .ok_or_else(|| format!("ContainerStatus of {id}: no status"))
    }

    /// Polls ContainerStatus until the container has exited.
    pub fn wait_exited(&self, id: &str, timeout: Duration) -> Result<ContainerStatus, String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let status = self.container_status(id)?;
            if status.state == ContainerState::ContainerExited as i32 {
                return Ok(status);
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("{id} still {:?} after {timeout:?}", status.state));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn container_stats(&self, id: &str) -> Result<ContainerStats, String> {
        let client = &mut self.client();
        self.call(
            "ContainerStats",
            client.container_stats(Request::new(ContainerStatsRequest {
                container_id: id.into(),
            })),
        )?
        .stats
        .ok_or_else(|| format!("ContainerStats of {id}: no stats"))
    }

    pub fn stop_container(&self, id: &str, timeout: Duration) -> Result<(), String> {
        let client = &mut self.client();
        self.call(
            "StopContainer",
            client.stop_container(Request::new(StopContainerRequest {
                container_id: id.into(),
                timeout: timeout.as_secs() as i64,
            })),
        )
        .map(drop)
    }

    pub fn remove_container(&self, id: &str) -> Result<(), String> {
        let client = &mut self.client();
        self.call(
            "RemoveContainer",
            client.remove_container(Request::new(RemoveContainerRequest {
                container_id: id.into(),
            })),
        )
        .map(drop)
    }

    /// The ids of the pod sandboxes CRI knows by `name` (in any state).
    pub fn pods_named(&self, name: &str) -> Result<Vec<String>, String> {
        let client = &mut self.client();
        let r = self.call(
            "ListPodSandbox",
            client.list_pod_sandbox(Request::new(ListPodSandboxRequest { filter: None })),
        )?;
        Ok(r.items
            .into_iter()
            .filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == name))
            .map(|p| p.id)
            .collect())
    }

    /// The ids of the containers CRI knows in `pod`.
    pub fn containers_of(&self, pod: &str) -> Result<Vec<String>, String> {
        let client = &mut self.client();
        let r = self.call(
            "ListContainers",
            client.list_containers(Request::new(ListContainersRequest {
                filter: Some(ContainerFilter {
                    pod_sandbox_id: pod.into(),
                    ..Default::default()
                }),
            })),
        )?;
        Ok(r.containers.into_iter().map(|c| c.id).collect())
    }

    /// The pod's IP when it has a network of its own.
    pub fn pod_ip(&self, pod: &str) -> Result<String, String> {
        let client = &mut self.client();
        let r = self.call(
            "PodSandboxStatus",
            client.pod_sandbox_status(Request::new(PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: false,
            })),
        )?;
        Ok(r.status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default())
    }

    pub fn stop_pod(&self, pod: &str) -> Result<(), String> {
        let client = &mut self.client();
        self.call(
            "StopPodSandbox",
            client.stop_pod_sandbox(Request::new(StopPodSandboxRequest {
                pod_sandbox_id: pod.into(),
            })),
        )
        .map(drop)
    }

    pub fn remove_pod(&self, pod: &str) -> Result<(), String> {
        let client = &mut self.client();
        self.call(
            "RemovePodSandbox",
            client.remove_pod_sandbox(Request::new(RemovePodSandboxRequest {
                pod_sandbox_id: pod.into(),
            })),
        )?;
        if let Some(config) = self.pods.lock().unwrap().remove(pod) {
            let _ = std::fs::remove_dir_all(config.log_directory);
        }
        Ok(())
    }

    /// Every name CRI's ListImages gives (each image's repo tags), as the kubelet sees them.
    pub fn image_names(&self) -> Result<Vec<String>, String> {
        let client = &mut ImageServiceClient::new(self.channel.clone());
        let images = self.call(
            "ListImages",
            client.list_images(Request::new(ListImagesRequest { filter: None })),
        )?;
        Ok(images
            .images
            .into_iter()
            .flat_map(|i| i.repo_tags)
            .collect())
    }
}
