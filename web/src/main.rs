//! `chalk-web`: serves the demo pages on 127.0.0.1 (elsewhere only with a token).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use chalk_web::{
    app::{App, Config},
    limits::{self, Limits},
    server,
};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "chalk-web",
    version,
    about = "The chalk-shim demo pages: split a live terminal into forks; suspend and resume a sandbox."
)]
struct Args {
    /// Where to listen; an address beyond loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The token every request must carry (open the page as /?token=TOKEN).
    #[arg(long, env = "CHALK_WEB_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// containerd's socket.
    #[arg(
        long,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: String,
    #[arg(short, long, env = "CONTAINERD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// The shim's runtime options (where its snapshot store is), if not the default ones.
    #[arg(long, env = "CHALK_SHIM_CONFIG")]
    config: Option<PathBuf>,
    /// The image the sandboxes run (a shell at /bin/sh), unpacked for --snapshotter.
    #[arg(long, default_value = "docker.io/library/busybox:latest")]
    image: String,
    #[arg(long, default_value = "overlayfs")]
    snapshotter: String,
    /// Where the terminals' fifos are made (root-only).
    #[arg(long, default_value = "/run/chalk-web")]
    state_dir: PathBuf,
    /// The most sandboxes at once, and per client.
    #[arg(long, default_value_t = 8)]
    max_sandboxes: usize,
    #[arg(long, default_value_t = 4)]
    max_per_client: usize,
    /// Each sandbox's memory limit.
    #[arg(long, default_value = "256M", value_parser = limits::parse_size)]
    memory: u64,
    /// How long a sandbox may run (from each start) or stay suspended: it is then removed.
    #[arg(long, default_value = "30m", value_parser = chalk_runtime::lifetime::parse_duration)]
    lifetime: Duration,
    /// The CNI network the sandboxes are on (as `chalkctl run --net`); none, loopback only,
    /// by default: a public demo's visitors must not reach the network from its sandboxes.
    #[arg(long, default_value = "none")]
    net: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chalk-web: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: Args) -> Result<(), String> {
    limits::check_listen(&args.listen, args.token.as_deref())?;
    if args.net != chalk_runtime::network::NO_NETWORK {
        chalk_runtime::network::request::check_name(&args.net)
            .map_err(|e| format!("--net: {e}"))?;
    }
    if args.max_sandboxes == 0 || args.max_per_client == 0 {
        return Err("--max-sandboxes and --max-per-client must be at least 1".into());
    }
    let cfg = Config {
        address: args.address,
        namespace: args.namespace,
        runtime_config: args.config,
        image: args.image,
        snapshotter: args.snapshotter,
        state_dir: args.state_dir,
        network: args.net,
        limits: Limits {
            total: args.max_sandboxes,
            per_client: args.max_per_client,
            memory: args.memory,
            lifetime: args.lifetime,
        },
        token: args.token,
    };
    let app = App::new(cfg).map_err(|e| e.to_string())?;
    match app.reclaim() {
        Ok(0) => {}
        Ok(n) => eprintln!("chalk-web: removed {n} sandboxes an earlier run left"),
        Err(e) => return Err(format!("look for an earlier run's sandboxes: {e}")),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start a runtime: {e}"))?;
    // The App (and the containerd client in it, which owns a runtime of its own) outlives the
    // async runtime: dropping it inside would panic.
    let served = app.clone();
    rt.block_on(async move {
        let app = served;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listen on {}: {e}", args.listen))?;
        // The line scripts and tests wait for.
        println!(
            "chalk-web: serving http://{}/",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        tokio::spawn(app.clone().reap());
        let stop = async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            // A closed terminal: the server stops as on Ctrl-C rather than leave sandboxes.
            let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = hangup.recv() => {}
            }
        };
        // Open terminals would hold a graceful shutdown for ever: the signal ends serving.
        let served = tokio::select! {
            r = axum::serve(listener, server::router(app.clone())) => r.map_err(|e| e.to_string()),
            _ = stop => Ok(()),
        };
        eprintln!("chalk-web: stopping: removing its sandboxes");
        app.shutdown().await;
        served
    })?;
    rt.shutdown_timeout(Duration::from_secs(1));
    drop(app);
    Ok(())
}
