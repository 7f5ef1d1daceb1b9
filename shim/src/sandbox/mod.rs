//! The Task layer: containerd's task operations on this shim's containers and their gVisor
//! sandboxes, in plain Rust. `task.rs` decodes ttrpc requests into these calls and their
//! results into replies; here nothing speaks ttrpc. One operation (or family of them) per
//! file. The runtime ([`RuntimeFactory`]), containerd's records ([`Records`]) and the event
//! sink ([`EventSink`]) are traits, so the lifecycle is unit-tested with fakes (`tests.rs`).
//!
//! The lock rules are written where the locks are: see `crate::container`.

mod checkpoint;
mod control;
mod create;
mod delete;
mod exec;
mod exits;
mod hold;
mod launch;
mod network;
mod pod;
mod pod_restore;
mod restore;
mod seal;
mod start;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use containerd_shim::ExitSignal;

pub use create::CreateRequest;
pub use exec::ExecRequest;
pub use hold::Verdict;
pub use seal::Seals;

use crate::{
    container::Container,
    containerd::Records,
    errors::{Result, ShimError},
    events::EventSink,
    logger::LogContext,
    runtimes::RuntimeFactory,
};

#[derive(Clone)]
pub struct Sandboxes {
    inner: Arc<Inner>,
}

struct Inner {
    namespace: String,
    /// containerd's gRPC address: chalkctl's, when a lifetime ends.
    containerd_address: String,
    runtimes: Arc<dyn RuntimeFactory>,
    records: Arc<dyn Records>,
    events: Arc<dyn EventSink>,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    exit: Arc<ExitSignal>,
    /// Seals still running after their Checkpoint answered.
    seals: Arc<Seals>,
    /// Pods whose stop signals the node agent holds.
    holds: hold::Holds,
}

impl Sandboxes {
    pub fn new(
        namespace: &str,
        containerd_address: &str,
        runtimes: Arc<dyn RuntimeFactory>,
        records: Arc<dyn Records>,
        events: Arc<dyn EventSink>,
        exit: Arc<ExitSignal>,
        seals: Arc<Seals>,
    ) -> Self {
        Sandboxes {
            inner: Arc::new(Inner {
                namespace: namespace.to_string(),
                containerd_address: containerd_address.to_string(),
                runtimes,
                records,
                events,
                containers: Mutex::new(HashMap::new()),
                exit,
                seals,
                holds: Default::default(),
            }),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    pub(crate) fn container(&self, id: &str) -> Result<Arc<Container>> {
        self.inner
            .containers
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::NoContainer(id.to_string()))
    }

    /// Every container of this shim, to look through without holding the map's lock.
    fn all_containers(&self) -> Vec<Arc<Container>> {
        let map = self.inner.containers.lock().unwrap();
        map.values().cloned().collect()
    }

    fn events(&self) -> &dyn EventSink {
        self.inner.events.as_ref()
    }

    fn records(&self) -> &dyn Records {
        self.inner.records.as_ref()
    }

    fn log_context(&self, container_id: &str) -> LogContext {
        LogContext {
            container_id: container_id.to_string(),
            namespace: self.inner.namespace.clone(),
        }
    }

    fn lifetime_context(&self) -> crate::lifetime::Context {
        crate::lifetime::Context {
            records: self.inner.records.clone(),
            address: self.inner.containerd_address.clone(),
            namespace: self.inner.namespace.clone(),
        }
    }
}

/// A process's name in messages: `init`, or its exec id.
fn display_exec(exec_id: &str) -> &str {
    if exec_id.is_empty() {
        "init"
    } else {
        exec_id
    }
}
