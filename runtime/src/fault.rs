//! Fault points for the fault-injection suite, compiled into debug builds only (a release
//! build's are empty). A case arms one by creating `$CHALK_FAULT_DIR/<id>.<stage>`; the
//! process that reaches it writes `<id>.<stage>.reached` and waits while the arm file is
//! there (60 s at most), so that the case can kill it at exactly that moment.

/// Stops here while a fault case has armed `stage` for container `id` (debug builds only).
#[cfg(debug_assertions)]
pub fn point(stage: &str, id: &str) {
    use std::{path::Path, time::Duration};
    let Some(dir) = std::env::var_os("CHALK_FAULT_DIR") else {
        return;
    };
    let armed = Path::new(&dir).join(format!("{id}.{stage}"));
    if !armed.exists() {
        return;
    }
    log::warn!("container {id}: fault point {stage} reached; waiting to be killed");
    let _ = std::fs::write(Path::new(&dir).join(format!("{id}.{stage}.reached")), b"");
    for _ in 0..600 {
        if !armed.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn point(_stage: &str, _id: &str) {}
