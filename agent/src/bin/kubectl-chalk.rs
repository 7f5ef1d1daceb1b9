//! `kubectl chalk` (kubectl runs `kubectl-chalk` from PATH): snapshot, suspend, fork and
//! resume pods through PodSnapshot objects; chalk-agent on each node carries them out.

use std::time::Duration;

use chalk_agent::plugin::{self, SnapshotAsk};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kubectl chalk", version, about)]
struct Cli {
    /// The namespace (else the kubeconfig context's).
    #[arg(long, short = 'n', global = true)]
    namespace: Option<String>,
    /// Print the result as JSON.
    #[arg(long, short = 'o', global = true, value_parser = ["table", "json"], default_value = "table")]
    output: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Snapshot a running pod (whole sandbox, memory included); it runs on.
    Snapshot {
        pod: String,
        /// The PodSnapshot's name (default: <pod>-<unix time>).
        #[arg(long)]
        name: Option<String>,
        /// Push it to this registry reference so that pods on any node start from it.
        #[arg(long, value_name = "REF")]
        push_to: Option<String>,
        /// Seconds to wait for the node's agent.
        #[arg(long, default_value_t = 300)]
        wait: u64,
    },
    /// Snapshot a pod, push it, and delete the pod; `resume` makes it again on any node.
    Suspend {
        pod: String,
        #[arg(long)]
        name: Option<String>,
        /// Where it is pushed (without it the pod resumes on its own node only).
        #[arg(long, value_name = "REF")]
        push_to: Option<String>,
        /// Keep the snapshot on the node too once pushed.
        #[arg(long)]
        keep_on_node: bool,
        #[arg(long, default_value_t = 300)]
        wait: u64,
    },
    /// New pods starting from a PodSnapshot, placed by the scheduler unless --node is given.
    Fork {
        snapshot: String,
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long)]
        node: Option<String>,
    },
    /// The suspended pod of a PodSnapshot made again, under its own name.
    Resume {
        snapshot: String,
        #[arg(long)]
        node: Option<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("kubectl chalk: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("the cluster (KUBECONFIG): {e}"))?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let json = cli.output == "json";
    match cli.command {
        Command::Snapshot {
            pod,
            name,
            push_to,
            wait,
        } => {
            let ask = SnapshotAsk {
                pod,
                name,
                push_to,
                suspend: false,
                keep_on_node: false,
                wait: Duration::from_secs(wait),
            };
            print_snapshot(plugin::snapshot(&client, &ns, ask).await?, json)
        }
        Command::Suspend {
            pod,
            name,
            push_to,
            keep_on_node,
            wait,
        } => {
            let ask = SnapshotAsk {
                pod,
                name,
                push_to,
                suspend: true,
                keep_on_node,
                wait: Duration::from_secs(wait),
            };
            print_snapshot(plugin::snapshot(&client, &ns, ask).await?, json)
        }
        Command::Fork {
            snapshot,
            count,
            node,
        } => {
            let pods = plugin::fork(&client, &ns, &snapshot, count, node.as_deref()).await?;
            print_pods(&pods, json);
            Ok(())
        }
        Command::Resume { snapshot, node } => {
            let pod = plugin::resume(&client, &ns, &snapshot, node.as_deref()).await?;
            print_pods(&[pod], json);
            Ok(())
        }
    }
}

fn print_snapshot(ps: chalk_agent::crd::PodSnapshot, json: bool) -> Result<(), String> {
    use kube::ResourceExt;
    let status = ps.status.clone().unwrap_or_default();
    if json {
        let v = serde_json::json!({"name": ps.name_any(), "status": status});
        println!("{v}");
    } else {
        println!(
            "{} {} on {} ({} bytes): restore-from {}",
            ps.name_any(),
            if status.suspended {
                "suspended"
            } else {
                "completed"
            },
            status.node.unwrap_or_default(),
            status.size_bytes.unwrap_or(0),
            status.restore_from.unwrap_or_default()
        );
    }
    Ok(())
}

fn print_pods(pods: &[String], json: bool) {
    if json {
        println!("{}", serde_json::json!({ "pods": pods }));
    } else {
        for p in pods {
            println!("pod/{p}");
        }
    }
}
