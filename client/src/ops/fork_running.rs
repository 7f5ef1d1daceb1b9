//! `chalkctl fork --id`: forks of a running sandbox, made from its checkpoint the moment runsc
//! has written it. The checkpoint is asked for in the store's fresh directory, so the shim
//! never seals it (nothing is hashed or kept): the forks hard-link its files and it is removed
//! once they run, whatever became of them.

use std::collections::HashMap;

use chalk_runtime::snapshot::store::{Pointer, Store};

use super::fork::{
    check_ids, check_memory, fork_ids, fork_pool, host_available_memory, image_config, memory_of,
    pod_members, ForkOptions, Forked, Parts,
};
use crate::{
    containerd::{runtime_name, Client, Result, RUNTIME},
    progress::Progress,
    records::snapshots::{self, CHECKPOINT_TAR},
    Error,
};

/// Forks `count` sandboxes of running sandbox `source` (`id`, or ids numbered from it).
pub fn fork_running(
    client: &mut Client,
    source: &str,
    id: Option<&str>,
    count: usize,
    opts: &ForkOptions,
    progress: &Progress,
) -> Result<Vec<Forked>> {
    check_ids(id, source, count)?;
    let container = client.container(source)?;
    if runtime_name(&container) != RUNTIME {
        return Err(format!(
            "sandbox {source} runs {:?}, not {RUNTIME}: only chalk sandboxes can be forked",
            runtime_name(&container)
        )
        .into());
    }
    let names = crate::records::names::numbered(opts.name.as_deref(), count);
    crate::records::names::check_free(client, &names)?;
    let stamp: String = crate::clock::now()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let store = client.store()?;
    let token = Store::token(
        client.namespace(),
        &format!("fork-{source}-{stamp}-{}", std::process::id()),
    );
    client.lease(&format!("chalkctl-fork-{stamp}-{}", std::process::id()))?;
    // containerd 1.6 stores the spec on every checkpoint and refuses one it already holds.
    client.mark_spec(&container, chalk_labels::CHECKPOINTED_AT, &stamp)?;
    let checkpointed = progress.during(
        &format!("checkpointing {source} (it keeps running)"),
        || client.checkpoint(source, false, Some(&store.fresh_path(&token))),
    );
    let forks = checkpointed.and_then(|_| {
        let p = parts_of_running(client, &store, &token, source, opts)?;
        check_memory(
            memory_of(p.manifest.as_ref()),
            count,
            host_available_memory(),
            opts.force,
        )?;
        let ids = fork_ids(id, source, &stamp, count);
        progress.step(&format!(
            "checkpoint of {source} written; forking {count} from it"
        ));
        Ok(fork_pool(client, &p, &ids, &names, "", progress))
    });
    // The forks hold their own links to the files: the checkpoint goes, whatever happened.
    if let Err(e) = store.remove_fresh(&token) {
        eprintln!("chalkctl: {e}");
    }
    client.release();
    forks
}

/// What a restore of sandbox `source`'s fresh checkpoint `token` needs: the checkpoint as a
/// pointer to it, and the rest from the running sandbox's own record.
fn parts_of_running(
    client: &Client,
    store: &Store,
    token: &str,
    source: &str,
    opts: &ForkOptions,
) -> Result<Parts> {
    let manifest = store
        .fresh_manifest(token)
        .map_err(|e| Error::from(format!("the checkpoint of {source}: {e}")))?;
    let container = client.container(source)?;
    let (image, base) = snapshots::base_image(client, &container.image)?;
    let pointer = snapshots::tar_of_pointer(&Pointer::to_token(token))?;
    let checkpoint = client.write_blob(CHECKPOINT_TAR, pointer, HashMap::new())?;
    let spec = container
        .spec
        .clone()
        .ok_or_else(|| Error::from(format!("sandbox {source} has no spec")))?;
    Ok(Parts {
        checkpoint,
        source: source.to_string(),
        members: pod_members(Some(&manifest))?,
        lifetime: opts.clone(),
        spec,
        snapshotter: container.snapshotter.clone(),
        image: chalk_runtime::snapshot::manifest::ImageRef::unpinned(&image).to_string(),
        chain_id: image_config(client, &base)?.1,
        base,
        manifest: Some(manifest),
    })
}
