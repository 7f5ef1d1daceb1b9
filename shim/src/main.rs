//! containerd-shim-chalk-v1: containerd's `io.containerd.chalk.v1` runtime, running each
//! container (or each Kubernetes pod) in a gVisor sandbox through runsc.

mod chalkctl;
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
mod pull_cgroup;
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
    bound_allocator();
    if info::handle_info_flag() {
        return;
    }
    containerd_shim::run::<service::Service>("io.containerd.chalk.v1", None);
}

/// A long-lived shim hashes each checkpoint on fresh threads with 1 MiB read buffers: glibc
/// gives each thread an arena of its own (up to 8 per core) and, once such a buffer is freed,
/// raises its mmap threshold so that the next ones stay in those arenas. The soak saw a
/// shim's RSS grow by 18 MB over 20 snapshots that way; two arenas and a fixed threshold
/// (freed large buffers go back to the kernel) keep it flat.
fn bound_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt(3) only sets the allocator's parameters; no thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}
