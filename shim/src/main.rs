//! containerd-shim-chalk-v1: containerd's `io.containerd.chalk.v1` runtime, running each
//! container (or each Kubernetes pod) in a gVisor sandbox through runsc.

mod container;
mod containerd;
mod errors;
mod events;
mod gpu;
mod hooks;
mod info;
mod io;
mod lifetime;
mod logger;
mod metrics;
mod oom;
mod private_mounts;
mod reaper;
mod rootfs;
mod runtime_options;
mod runtimes;
mod sandbox;
mod sandbox_exec;
mod service;
mod task;
mod terminal;
mod unpacked;

fn main() {
    if info::handle_info_flag() {
        return;
    }
    containerd_shim::run::<service::Service>("io.containerd.chalk.v1", None);
}
