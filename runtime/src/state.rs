//! The lifecycle of one process (a container's init or an exec), as an explicit state machine.
//! Illegal transitions are errors that name the process and its state, never panics.

use std::fmt;

use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Paused,
    Stopped,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
        })
    }
}

/// What can happen to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Start,
    Pause,
    Resume,
    Exit,
}

impl Event {
    fn verb(self) -> &'static str {
        match self {
            Event::Start => "start",
            Event::Pause => "pause",
            Event::Resume => "resume",
            Event::Exit => "exit",
        }
    }
}

/// The status after `event`, or an error if `event` cannot happen in `from`.
pub fn transition(id: &str, from: Status, event: Event) -> Result<Status> {
    use Status::*;
    let to = match (from, event) {
        (Created, Event::Start) => Running,
        (Running, Event::Pause) => Paused,
        (Paused, Event::Resume) => Running,
        (Created | Running | Paused, Event::Exit) => Stopped,
        _ => {
            return Err(Error::InvalidState {
                op: event.verb(),
                id: id.to_string(),
                from,
            })
        }
    };
    Ok(to)
}

/// A process may be deleted before it ran or after it stopped; never while it lives.
pub fn check_deletable(id: &str, status: Status) -> Result<()> {
    match status {
        Status::Created | Status::Stopped => Ok(()),
        _ => Err(Error::InvalidState {
            op: "delete",
            id: id.to_string(),
            from: status,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{Event::*, Status::*, *};

    #[test]
    fn legal_paths() {
        assert_eq!(transition("c", Created, Start).unwrap(), Running);
        assert_eq!(transition("c", Running, Pause).unwrap(), Paused);
        assert_eq!(transition("c", Paused, Resume).unwrap(), Running);
        for from in [Created, Running, Paused] {
            assert_eq!(transition("c", from, Exit).unwrap(), Stopped);
        }
    }

    #[test]
    fn illegal_paths_name_the_process_and_state() {
        for (from, ev) in [
            (Running, Start),
            (Stopped, Start),
            (Created, Pause),
            (Paused, Pause),
            (Running, Resume),
            (Stopped, Exit),
            (Stopped, Resume),
        ] {
            let err = transition("c1", from, ev).unwrap_err().to_string();
            assert!(
                err.contains("c1") && err.contains(&from.to_string()),
                "{err}"
            );
        }
    }

    #[test]
    fn only_created_or_stopped_can_be_deleted() {
        assert!(check_deletable("c", Created).is_ok());
        assert!(check_deletable("c", Stopped).is_ok());
        assert!(check_deletable("c", Running).is_err());
        assert!(check_deletable("c", Paused).is_err());
    }
}
