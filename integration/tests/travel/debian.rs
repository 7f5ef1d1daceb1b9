//! The Debian workload (integration/debian/workload.py) moves to another host: suspended to
//! the registry on A, resumed on B, and forked on B from the same reference, each carrying on
//! with every part of its state.

use chalk_integration::debian::{self, carries_on, status, wait_started, DEBIAN_IMAGE};

use super::*;

pub fn a_debian_workload_resumes_and_forks_on_another_host(h: &Hosts) -> TestResult {
    let (id, fork) = ("tr-deb", "tr-deb-fork");
    for host in [&h.a, &h.b] {
        host.remove(id);
        host.remove(fork);
    }
    let result = (|| {
        h.a.c.import_debian().map_err(|e| e.to_string())?;
        let mut run = vec!["run", DEBIAN_IMAGE, id, "--"];
        run.extend_from_slice(debian::WORKLOAD);
        let out = h.chalkctl(&h.a, &run);
        ensure!(out.code == 0, "run on A: {out:?}");
        wait_started(&h.a.c, id)?;
        let before = status(&h.a.c, id)?;
        let reference = h.reference("travel/tr-deb:suspended");
        let started = Instant::now();
        h.suspend_to(&h.a, id, &reference)?;
        let suspended = started.elapsed();
        let started = Instant::now();
        let out = h.chalkctl(&h.b, &["resume", "--id", id, "--from", &reference]);
        ensure!(out.code == 0, "resume on B: {out:?}");
        let resumed = started.elapsed();
        carries_on(&h.b.c, id, &before, "on-b")?;
        let out = h.chalkctl(&h.b, &["fork", "--snapshot", &reference, "--fork-id", fork]);
        ensure!(out.code == 0, "fork on B: {out:?}");
        let forked = carries_on(&h.b.c, fork, &before, "fork-on-b")?;
        ensure!(
            !forked.inotify_seen().iter().any(|n| n == "on-b"),
            "the fork saw the resumed sandbox's file: {:?}",
            forked.inotify_seen()
        );
        testkit::note(format!(
            "Debian workload: suspend --to --release on A {suspended:.1?}, resume --from on B \
             {resumed:.1?}"
        ));
        Ok(())
    })();
    h.a.remove(id);
    h.b.remove(fork);
    h.b.conclude(result, &[id, fork], &[])
}
