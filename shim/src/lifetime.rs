//! The timer of a sandbox's lifetime. It lives in the shim: the shim lives exactly as long as
//! the sandbox (and survives containerd's restarts, which a client's timer would not, while a
//! timer in containerd does not exist). When the time is up, the shim asks `chalkctl expire`
//! to destroy or suspend the sandbox, through containerd like any client, so the registry,
//! containerd's records and the snapshot are what `chalkctl suspend` would make. If that
//! cannot be done, the shim kills the sandbox itself: a lifetime is a bound on compute.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use chalk_runtime::{
    lifetime::{Lifetime, EXPIRES_AT_LABEL},
    snapshot::manifest::rfc3339_at,
};

use crate::{chalkctl, container::Container, containerd::Records};

/// Where the timer reaches containerd: its records (for the label `chalkctl get` reads),
/// and its address and namespace (for chalkctl).
#[derive(Clone)]
pub struct Context {
    pub records: Arc<dyn Records>,
    pub address: String,
    pub namespace: String,
}

/// How often the expiry is attempted through chalkctl before the shim kills the sandbox.
const ATTEMPTS: u32 = 3;
/// Between attempts (containerd may be restarting).
const RETRY: Duration = Duration::from_secs(5);
/// How long one attempt may take (a suspend writes the sandbox's memory).
const EXPIRE_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts the timer of `c`, which has just started (or been restored) with `lifetime`. The
/// label `chalkctl get` reads is set before Start returns, so none reads last run's end.
pub fn watch(ctx: &Context, c: &Arc<Container>, lifetime: Lifetime) {
    let exit = c.state.lock().unwrap().init.exit.clone();
    let ends = SystemTime::now() + lifetime.duration;
    let ends_secs = ends
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let at = rfc3339_at(ends_secs);
    if let Err(e) = ctx.records.set_label(&c.id, EXPIRES_AT_LABEL, &at) {
        log::warn!(
            "container {}: lifetime ends at {at}, not recorded: {e}",
            c.id
        );
    }
    let id = c.id.clone();
    let (ctx, c) = (ctx.clone(), c.clone());
    std::thread::Builder::new()
        .name("lifetime".into())
        .spawn(move || {
            let left = ends.duration_since(SystemTime::now()).unwrap_or_default();
            if exit.wait_timeout(left).is_some() {
                return; // ended (or suspended) before its time
            }
            expire(&ctx, &c, lifetime);
        })
        .map(drop)
        .unwrap_or_else(|e| log::error!("container {id}: no lifetime timer: {e}"));
}

fn expire(ctx: &Context, c: &Container, lifetime: Lifetime) {
    let action = lifetime.on_timeout.as_str();
    log::info!("container {}: lifetime over: {action}", c.id);
    let exit = c.state.lock().unwrap().init.exit.clone();
    let log_file = c.bundle.join(".expire.log");
    for attempt in 1..=ATTEMPTS {
        let args = ["expire", "--id", &c.id, "--action", action];
        let to = chalkctl::Target {
            address: &ctx.address,
            namespace: &ctx.namespace,
            env: &[],
            memory_max: None,
        };
        match chalkctl::run(&to, &args, &log_file, EXPIRE_TIMEOUT) {
            Ok(done) if done.status == 0 => return,
            Ok(done) => log::warn!(
                "container {}: chalkctl expire ({action}), attempt {attempt}: exit {}: {}",
                c.id,
                done.status,
                done.said
            ),
            Err(e) => log::warn!(
                "container {}: chalkctl expire ({action}), attempt {attempt}: {e}",
                c.id
            ),
        }
        if exit.wait_timeout(RETRY).is_some() {
            return; // gone meanwhile (a suspend that did finish, or someone else)
        }
    }
    log::error!(
        "container {}: its lifetime is over and it could not be {action}ed: killing it",
        c.id
    );
    c.kill_sandbox();
}
