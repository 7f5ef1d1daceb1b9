//! `chalkctl serve-lazy`: one blob served while it arrives, from the job on stdin to the blob
//! in the store (or the reason it failed), the mount gone and the process ended.

use std::{
    fs::OpenOptions,
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    sync::Arc,
    time::{Duration, Instant},
};

use chalk_runtime::snapshot::{oci, store::Store};

use super::{arrivals::Arrivals, fetch::Fetch, fuse::PagesFile, Job, READ_WAIT};
use crate::remote::{hosts::Use, session, Access};
use crate::{Error, Result};

/// How long a complete file stays mounted for a restore that linked it just before.
const GRACE: Duration = Duration::from_secs(10);
/// How long a failed or complete file waits for runsc to close it before it is detached.
const CLOSE_WAIT: Duration = Duration::from_secs(600);

/// Serves the job on stdin; prints `ready` (or `error: why`) once, on stdout.
pub fn main() -> Result<()> {
    let mut text = Vec::new();
    std::io::stdin()
        .read_to_end(&mut text)
        .map_err(|e| Error::from(format!("read the job: {e}")))?;
    let job: Job = serde_json::from_slice(&text).map_err(|e| Error::from(e.to_string()))?;
    drop(text);
    let mut out = std::io::stdout();
    let served = serve(&job, &mut || {
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    });
    if let Err(e) = &served {
        let _ = writeln!(out, "error: {e}");
    }
    served
}

fn serve(job: &Job, ready: &mut dyn FnMut()) -> Result<()> {
    let hex = oci::sha256_hex_of(&job.digest)
        .ok_or_else(|| Error::from(format!("{} is not a sha256 digest", job.digest)))?;
    if !job.pieces.fit(job.size) {
        return Err("the manifest's piece digests do not fit pages.img".into());
    }
    let store = Store::open(&job.store).map_err(|e| Error::from(e.to_string()))?;
    let lazy = store
        .begin_lazy(hex, job.size)
        .map_err(|e| Error::from(e.to_string()))?;
    let failed = |why: String| {
        lazy.fail(&why);
        Error::from(why)
    };
    let data = Arc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(lazy.data())
            .map_err(|e| failed(format!("open {}: {e}", lazy.data().display())))?,
    );
    let reference = crate::remote::reference(&job.reference)?;
    let access = Access {
        plain_http: job.plain_http,
        ..Access::new(job.hosts_dir.clone())
    };
    let credentials = job.credentials();
    let session = session::sessions_as(&access, &reference, Use::Pull, Some(&credentials))?
        .into_iter()
        .find(|s| s.endpoint.host == job.endpoint)
        .ok_or_else(|| {
            failed(format!(
                "no endpoint {} for {}",
                job.endpoint, job.reference
            ))
        })?;
    session
        .login(&reference, oci_client::RegistryOperation::Pull)
        .map_err(|e| failed(e.to_string()))?;
    let note = lazy.failure_note();
    let arrivals = Arc::new(Arrivals::telling(
        job.pieces.count_for(job.size),
        Some(Box::new(move |why: &str| note.write(why))),
    ));
    let fetch = Arc::new(Fetch {
        session: Arc::new(session),
        reference,
        digest: job.digest.clone(),
        size: job.size,
        pieces: job.pieces.clone(),
        arrivals: arrivals.clone(),
        data: data.clone(),
        whole: Default::default(),
    });
    // The first piece proves the registry serves ranges (and the credentials work) before
    // anything depends on this server.
    if arrivals.count() > 0 {
        let first = arrivals.next_run(1).unwrap_or(0..1);
        fetch.first(first);
        if let Some(why) = arrivals.failure() {
            return Err(failed(why));
        }
    }
    let file = PagesFile {
        size: job.size,
        pieces: job.pieces.clone(),
        arrivals: arrivals.clone(),
        data,
        wait_limit: READ_WAIT,
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoDev,
        fuser::MountOption::FSName("chalk-pages".into()),
    ];
    config.n_threads = Some(2);
    let mountpoint = lazy.mountpoint();
    let session = fuser::spawn_mount(file, &mountpoint, &config)
        .map_err(|e| failed(format!("mount {}: {e}", mountpoint.display())))?;
    lazy.serving().map_err(|e| failed(e.to_string()))?;
    ready();

    let mut workers = vec![{
        let f = fetch.clone();
        std::thread::spawn(move || f.in_order())
    }];
    for _ in 0..super::fetch::DEMAND_FETCHERS {
        let f = fetch.clone();
        workers.push(std::thread::spawn(move || f.on_demand()));
    }
    let outcome = fetch
        .check_whole(CLOSE_WAIT)
        .and_then(|()| lazy.complete(&store).map_err(|e| e.to_string()));
    if let Err(why) = &outcome {
        arrivals.fail(why);
    }
    for w in workers {
        let _ = w.join();
    }
    if let Err(why) = &outcome {
        lazy.fail(why);
        drop_record(job, &store);
    }
    // A complete file stays a moment for a restore that linked it just before.
    if outcome.is_ok() {
        std::thread::sleep(GRACE);
    }
    unmount(&mountpoint, CLOSE_WAIT);
    let _ = session.join();
    lazy.finish();
    outcome.map_err(Error::from)
}

/// The pull's record of a snapshot whose memory never arrived goes: nothing claims a
/// snapshot this host does not have.
fn drop_record(job: &Job, store: &Store) {
    let Some(r) = &job.record else { return };
    if let Ok(client) = crate::containerd::Client::connect(&r.address, &r.namespace) {
        let _ = client.delete_image(&r.name);
    }
    let _ = store.remove_ref(&Store::token(&r.namespace, &r.name));
}

/// Unmounts `path` once nothing has it open, or detaches it after `limit`.
fn unmount(path: &std::path::Path, limit: Duration) {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    let deadline = Instant::now() + limit;
    loop {
        // SAFETY: a NUL-terminated path; umount2 only reads it.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= deadline {
            chalk_runtime::snapshot::store::detach_mount(path);
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
