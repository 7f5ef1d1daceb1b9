//! A restore is verified at Create, before anything is made for it: its files intact, this
//! host and runsc fit, the sandbox would reach no further, and the image is the same by
//! digest (see `chalk_runtime::snapshot::describe::check_restore`).

use std::{path::Path, time::Instant};

use chalk_runtime::{
    runsc::{Features, SandboxRuntime},
    snapshot::{
        describe::{check_restore, Target},
        Manifest,
    },
};

use super::Sandboxes;
use crate::container::RestoreFrom;
use crate::errors::{Result, ShimError};

impl Sandboxes {
    /// Checks that the snapshot in `dir` may be restored as container `id` with `spec` (as
    /// runsc will get it).
    pub(super) fn verify_restore(
        &self,
        id: &str,
        dir: &Path,
        runtime: &dyn SandboxRuntime,
        features: &Features,
        spec: &serde_json::Value,
    ) -> Result<RestoreFrom> {
        if !dir.is_absolute() {
            return Err(ShimError::InvalidArgument(format!(
                "checkpoint directory {} is not absolute",
                dir.display()
            )));
        }
        let started = Instant::now();
        let m = Manifest::load(dir)?;
        m.verify_files(dir, 0)?;
        let image = if m.image.is_some() {
            self.records().image_of(id)?
        } else {
            None
        };
        let target = Target {
            id,
            runsc_version: &features.version,
            global: runtime.global(),
            spec,
            image: image.as_ref(),
        };
        check_restore(&m, dir, &target).map_err(ShimError::FailedPrecondition)?;
        log::info!(
            "container {id}: snapshot {} ({} bytes) verified in {:?}",
            dir.display(),
            m.total_size(),
            started.elapsed()
        );
        Ok(RestoreFrom {
            dir: dir.to_path_buf(),
            cuda_pids: m.extra.moved_pids(),
            pod_members: m.extra.pod_members(),
            terminal: m.terminal.clone(),
            unpacked: Default::default(),
        })
    }
}
