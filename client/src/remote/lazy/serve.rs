//! `chalkctl serve-lazy`: one blob served while it arrives, from the job on stdin to the blob
//! in the store (or the reason it failed), the mount gone and the process ended. A server
//! never outlives its job's deadline, nor the sandboxes that read it: once every reader has
//! closed the file (its sandbox ended) before it all arrived, or none opened it in
//! [`OPEN_WAIT`], serving fails and everything of it goes.

use std::{
    fs::OpenOptions,
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    sync::Arc,
    time::{Duration, Instant},
};

use chalk_runtime::snapshot::{oci, store::Store};

use super::{
    arrivals::Arrivals,
    fetch::Fetch,
    fuse::{PagesFile, Readers},
    Job, READ_WAIT,
};
use crate::remote::{hosts::Use, session, Access};
use crate::{Error, Result};

/// How long a complete file stays mounted for a restore that linked it just before.
const GRACE: Duration = Duration::from_secs(10);
/// How long a failed or complete file waits for runsc to close it before it is detached.
const CLOSE_WAIT: Duration = Duration::from_secs(60);
/// How long a file may go unopened once served: the restore that asked for it comes at once.
pub const OPEN_WAIT: Duration = Duration::from_secs(60);
/// How long a file may have no reader, after having had one, before serving ends.
const READERS_GONE: Duration = Duration::from_secs(5);

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
    let deadline = Instant::now() + Duration::from_secs(job.deadline_secs.max(1));
    let access = Access {
        plain_http: job.plain_http,
        deadline: Some(deadline),
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
    let vouched = vouched_for(job, &reference, &store);
    let fetch = Arc::new(Fetch {
        session: Arc::new(session),
        reference,
        digest: job.digest.clone(),
        size: job.size,
        pieces: job.pieces.clone(),
        arrivals: arrivals.clone(),
        data: data.clone(),
        whole: Default::default(),
        from_pieces: job
            .index
            .clone()
            .map(|i| super::from_pieces::FromPieces::new(i, &store, vouched)),
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
    let readers = Arc::new(Readers::default());
    let file = PagesFile {
        size: job.size,
        pieces: job.pieces.clone(),
        arrivals: arrivals.clone(),
        data,
        wait_limit: READ_WAIT,
        readers: readers.clone(),
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
    {
        let (arrivals, readers) = (arrivals.clone(), readers.clone());
        let served = Instant::now();
        std::thread::spawn(move || watch(&arrivals, &readers, served, deadline));
    }
    let outcome = fetch
        .check_whole(deadline.saturating_duration_since(Instant::now()))
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
        remember_pages(job, &fetch, &store);
        std::thread::sleep(GRACE);
    }
    unmount(&mountpoint, CLOSE_WAIT);
    let _ = session.join();
    lazy.finish();
    outcome.map_err(Error::from)
}

/// Whether this host vouches for the packed form whose index the job puts the memory
/// together by (`Store::catalog_vouches`).
fn vouched_for(job: &Job, reference: &oci_client::Reference, store: &Store) -> bool {
    match (&job.snapshot_id, &job.packed) {
        (Some(id), Some(packed)) => {
            let repository = crate::remote::packed::push::repository_of(reference);
            store.catalog_vouches(&repository, id, packed)
        }
        _ => false,
    }
}

/// Records the page digests of a packed snapshot's memory, all of it here and checked (each
/// piece against the index, the whole against the snapshot's digest), so the next push of its
/// sandbox from this host needs not hash its parent's memory again. Best effort.
fn remember_pages(job: &Job, fetch: &Fetch, store: &Store) {
    let (Some(id), Some(packed), Some(source)) =
        (&job.snapshot_id, &job.packed, &fetch.from_pieces)
    else {
        return;
    };
    if let Some(pages) = source.page_table() {
        let repository = crate::remote::packed::push::repository_of(&fetch.reference);
        let _ = store.catalog_pages_save(&repository, id, &pages, Some(packed));
    }
}

/// Fails serving once it has no reason to go on: its deadline passed, its readers are gone
/// (their sandbox ended) before the blob all arrived, or no reader came.
fn watch(arrivals: &Arrivals, readers: &Readers, served: Instant, deadline: Instant) {
    while !arrivals.complete() && arrivals.failure().is_none() {
        let why = stop_because(
            readers.ever(),
            readers.gone_for(),
            served.elapsed(),
            Instant::now() >= deadline,
        );
        if let Some(why) = why {
            arrivals.fail(&why);
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Why a server `served_for` so long should stop, if it should: `ever` whether a reader ever
/// opened the file, `gone_for` how long it has had none since, `late` its deadline passed.
fn stop_because(
    ever: bool,
    gone_for: Option<Duration>,
    served_for: Duration,
    late: bool,
) -> Option<String> {
    if late {
        return Some(
            "it did not all arrive within the time its server may take (the registry is too \
             slow, or never ends its answer)"
                .into(),
        );
    }
    if gone_for.is_some_and(|g| g >= READERS_GONE) {
        return Some(
            "every sandbox reading it closed it (they ended) before it all arrived: the rest \
             is not fetched"
                .into(),
        );
    }
    if !ever && served_for >= OPEN_WAIT {
        return Some(format!(
            "no restore opened it within {}s of its serving",
            OPEN_WAIT.as_secs()
        ));
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_ends_with_its_readers_without_one_and_by_its_deadline() {
        let s = Duration::from_secs;
        // Read now, or just closed by one reader while another may come: it goes on.
        assert_eq!(stop_because(true, None, s(600), false), None);
        assert_eq!(stop_because(true, Some(s(1)), s(600), false), None);
        assert_eq!(stop_because(false, None, s(5), false), None);
        let gone = stop_because(true, Some(READERS_GONE), s(20), false).unwrap();
        assert!(gone.contains("closed it"), "{gone}");
        let nobody = stop_because(false, None, OPEN_WAIT, false).unwrap();
        assert!(nobody.contains("no restore opened it"), "{nobody}");
        let late = stop_because(true, None, s(1), true).unwrap();
        assert!(late.contains("within the time"), "{late}");
    }
}
