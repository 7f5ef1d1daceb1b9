//! What the agent's controllers share: their error, how they wait for one, and how they
//! reach this node's containerd (blocking) from the async runtime.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube::runtime::controller::Action;

use crate::node::Node;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Node(String),
}

/// Runs a controller's reconciles to their end (its shutdown), logging those that fail.
pub async fn log_failures<T, E: std::fmt::Display>(results: impl Stream<Item = Result<T, E>>) {
    results
        .for_each(|r| async move {
            if let Err(e) = r {
                log::warn!("{e}");
            }
        })
        .await
}

/// A failed reconcile is logged and looked at again in 5 s.
pub fn retry_later<K, C>(_: Arc<K>, e: &Error, _: Arc<C>) -> Action {
    log::warn!("{e}");
    Action::requeue(Duration::from_secs(5))
}

/// Runs `f` against this node's containerd off the async runtime.
pub async fn on_node<T: Send + 'static>(
    node: &Node,
    f: impl FnOnce(&Node) -> Result<T, String> + Send + 'static,
) -> Result<T, Error> {
    let node = node.clone();
    tokio::task::spawn_blocking(move || f(&node))
        .await
        .map_err(|e| Error::Node(e.to_string()))?
        .map_err(Error::Node)
}
