//! chalk-agent: the node agent that carries out PodSnapshots (chalk.io/v1alpha1) and
//! Sandbox suspends for the pods on its node, through the node's containerd; run by the
//! DaemonSet in packaging/kubernetes/agent.yaml, or directly (`chalk-agent --node NAME`).
//! `chalk-agent cluster` is the cluster agent (the Deployment): Sandbox finalizers and the
//! retention of their snapshots in the registry. `chalk-agent crd` prints the
//! CustomResourceDefinition.

use std::{path::PathBuf, sync::Arc};

use chalk_agent::{agent, cluster, node::Node, sandboxes};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "chalk-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// This node's name as its kubelet registers it (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    /// containerd's socket on this node.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    address: String,
    /// chalk-shim's runtime options (its snapshot store); default: the shim's own default.
    #[arg(long, env = "CHALK_SHIM_CONFIG")]
    config: Option<PathBuf>,
    /// containerd's registry hosts directory, for pushes (hosts.toml, CA files).
    #[arg(
        long,
        global = true,
        env = "CHALK_HOSTS_DIR",
        default_value = "/etc/containerd/certs.d"
    )]
    hosts_dir: PathBuf,
    /// Plain HTTP to registries hosts.toml does not describe.
    #[arg(long, global = true)]
    plain_http: bool,
    /// `host[:port]/path`: suspended agent-sandbox Sandboxes keep their memory, pushed to
    /// PATH/NAMESPACE/NAME there (default: the shim's `[restore_from] suspend_to`, which
    /// pods resume from). Without either, their pods stop as they would without chalk.
    #[arg(long, env = "CHALK_SUSPEND_TO")]
    suspend_to: Option<String>,
    /// The RuntimeClasses whose handler is chalk-shim (their Sandboxes' pods are suspended
    /// with their memory).
    #[arg(long = "runtime-class", default_value = "chalk")]
    runtime_classes: Vec<String>,
    /// Suspends encrypt every blob for these age recipients (`age1…`, or files of them).
    #[arg(long, env = "CHALK_ENCRYPT_TO", value_delimiter = ',')]
    encrypt_to: Vec<String>,
    /// Suspends sign what they push with this PEM P-256 key, as cosign signs.
    #[arg(long, env = "CHALK_SIGN_KEY")]
    sign: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the PodSnapshot CustomResourceDefinition (YAML).
    Crd,
    /// The cluster agent (one per cluster): Sandbox finalizers, and their snapshots in the
    /// registry kept to the newest few and removed with them, by the agents' own records.
    Cluster {
        /// How many snapshots of a Sandbox the registry keeps (the newest).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
        keep_snapshots: u16,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        print!("{}", chalk_agent::crd::crd_yaml());
        return;
    }
    init_log();
    if let Some(Command::Cluster { keep_snapshots }) = cli.command {
        let access = chalk_client::remote::Access {
            plain_http: cli.plain_http,
            ..chalk_client::remote::Access::new(cli.hosts_dir.clone())
        };
        return runtime().block_on(async move {
            let client = cluster_client().await;
            log::info!("chalk-agent cluster: keeping {keep_snapshots} snapshots per Sandbox");
            let ctx = cluster::Context::new(client, access, keep_snapshots as usize);
            cluster::run(Arc::new(ctx)).await
        });
    }
    let Some(node_name) = cli.node.clone() else {
        eprintln!("chalk-agent: give --node (or NODE_NAME): this node's name in Kubernetes");
        std::process::exit(2);
    };
    let access = chalk_client::remote::Access {
        plain_http: cli.plain_http,
        encrypt_to: cli.encrypt_to.clone(),
        sign_with: cli.sign.clone(),
        ..chalk_client::remote::Access::new(cli.hosts_dir.clone())
    };
    // Recipients or a key a suspend could not use are refused before the agent starts.
    if let Err(e) = access.check_push() {
        eprintln!("chalk-agent: {e}");
        std::process::exit(2);
    }
    let node = Node {
        address: cli.address.clone(),
        config: cli.config.clone(),
        access,
    };
    // Pods resume only from where the shim's options say Sandboxes suspend to.
    let from_shim = node.options().ok().and_then(|o| o.restore_from.suspend_to);
    let suspend_to = match (cli.suspend_to.clone(), from_shim) {
        (Some(a), Some(b))
            if chalk_runtime::registry_name::canonical(&a)
                != chalk_runtime::registry_name::canonical(&b) =>
        {
            eprintln!(
                "chalk-agent: --suspend-to {a} is not the shim's [restore_from] suspend_to \
                 ({b}): pods could not resume from what the agent pushes; give one place"
            );
            std::process::exit(2);
        }
        (a, b) => a.or(b),
    };
    runtime().block_on(async move {
        let client = cluster_client().await;
        log::info!(
            "chalk-agent on node {node_name}: containerd {}",
            cli.address
        );
        let snapshots = agent::run(Arc::new(agent::Context::new(
            client.clone(),
            node_name.clone(),
            node.clone(),
        )));
        match suspend_to {
            Some(suspend_to) => {
                log::info!("Sandboxes suspend to {suspend_to}");
                let settings = sandboxes::Settings {
                    suspend_to,
                    runtime_classes: cli.runtime_classes.clone(),
                };
                let ctx = sandboxes::Context::new(client, node_name, node, settings);
                futures::join!(snapshots, sandboxes::run(Arc::new(ctx)));
            }
            None => snapshots.await,
        }
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The cluster's API, in-cluster or from KUBECONFIG; the process ends without it.
async fn cluster_client() -> kube::Client {
    match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chalk-agent: the cluster (in-cluster or KUBECONFIG): {e}");
            std::process::exit(1);
        }
    }
}

/// Logs to stderr at RUST_LOG's level (info by default).
fn init_log() {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() <= log::max_level()
        }
        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) && r.target().starts_with("chalk") {
                eprintln!("{} {}: {}", r.level(), r.target(), r.args());
            }
        }
        fn flush(&self) {}
    }
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(log::LevelFilter::Info);
    let _ = log::set_logger(&Stderr);
    log::set_max_level(level);
}
