//! The few containerd API calls `ctr` 1.6 has no command for (Update) or hides (Wait's exit
//! time), made with containerd's own gRPC client.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use containerd_client::{
    services::v1::{tasks_client::TasksClient, ResizePtyRequest, UpdateTaskRequest, WaitRequest},
    tonic::{transport::Channel, Request},
    with_namespace,
};

pub struct Api {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    namespace: String,
}

impl Api {
    pub fn connect(socket: &Path, namespace: &str) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let channel = rt
            .block_on(containerd_client::connect(socket))
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        Ok(Api {
            rt,
            channel,
            namespace: namespace.to_string(),
        })
    }

    fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
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
}
