//! `chalkctl wait`: until a sandbox runs, or until it exits.

use crate::{
    clock::seconds,
    containerd::{Client, Result},
    records::sandboxes::chalk_container,
};

/// What `chalkctl wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The sandbox's task runs (made and started, a resume or fork complete).
    Running,
    /// Its init has exited: the exit status.
    Exited,
}

/// Waits, at most `timeout`, until sandbox `id` is as `until` says; the exit status for
/// [`Until::Exited`].
pub fn wait(
    client: &Client,
    id: &str,
    until: Until,
    timeout: Option<std::time::Duration>,
) -> Result<Option<u32>> {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let late = |what: String| -> crate::Error {
        format!(
            "sandbox {id} {what} after {}: wait longer (--timeout)",
            seconds(started.elapsed())
        )
        .into()
    };
    match until {
        Until::Running => loop {
            let status = client.task_status(id)?;
            if matches!(&status, Some((s, _)) if s == "running") {
                return Ok(None);
            }
            if matches!(&status, Some((s, _)) if s == "stopped") {
                return Err(format!("sandbox {id} has stopped: it will not run again").into());
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                let now = match status {
                    Some((s, _)) => format!("is {s}"),
                    None if client.container(id).is_ok() => "has no task".to_string(),
                    None => "does not exist".to_string(),
                };
                return Err(late(now));
            }
            std::thread::sleep(Duration::from_millis(100));
        },
        Until::Exited => {
            chalk_container(client, id)?;
            let no_task = || -> crate::Error {
                format!("sandbox {id} has no task: it is not running (see chalkctl get --id {id})")
                    .into()
            };
            let Some(t) = timeout else {
                return client.wait(id)?.map(Some).ok_or_else(no_task);
            };
            // containerd's Wait has no deadline: watch the status, then collect the exit.
            loop {
                match client.task_status(id)? {
                    None => return Err(no_task()),
                    Some((s, _)) if s == "stopped" => {
                        return client.wait(id)?.map(Some).ok_or_else(no_task)
                    }
                    Some(_) if started.elapsed() >= t => return Err(late("still runs".into())),
                    Some(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
    }
}
