//! Running the hooks of one stage, in order, stopping at the first failure.

use std::fmt;

use crate::{
    config::{HookSpec, Stage},
    exec::{Exec, Outcome},
};

/// A hook that failed: which, how, and what it printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookError {
    pub stage: Stage,
    pub command: Vec<String>,
    pub how: String,
    pub output: String,
}

impl fmt::Display for HookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hook {:?} failed ({})",
            self.stage.as_str(),
            self.command,
            self.how
        )?;
        let output = self.output.trim();
        if !output.is_empty() {
            write!(f, ": {output}")?;
        }
        Ok(())
    }
}

impl std::error::Error for HookError {}

/// Runs every hook of `stage`, in the order given, with `env` (the shim adds the sandbox id,
/// the stage and the snapshot directory). Returns how many ran.
pub fn run_stage(
    hooks: &[HookSpec],
    stage: Stage,
    exec: &dyn Exec,
    env: &[(String, String)],
) -> Result<usize, HookError> {
    let mut ran = 0;
    for hook in hooks.iter().filter(|h| h.stage == stage) {
        let fail = |how: String, output: String| HookError {
            stage,
            command: hook.command.clone(),
            how,
            output,
        };
        let outcome: Outcome = exec
            .exec(hook.place, &hook.command, env, hook.timeout())
            .map_err(|e| fail("could not run".into(), e.to_string()))?;
        if !outcome.success() {
            return Err(fail(outcome.describe(hook.timeout()), outcome.output));
        }
        log::info!("{} hook {:?} ran", stage.as_str(), hook.command);
        ran += 1;
    }
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, time::Duration};

    use super::*;
    use crate::config::Place;

    /// Succeeds unless the program is `/fail` or `/hang`; records what ran.
    struct Fake(RefCell<Vec<String>>);

    impl Exec for Fake {
        fn exec(
            &self,
            place: Place,
            argv: &[String],
            _env: &[(String, String)],
            _timeout: Duration,
        ) -> crate::error::Result<Outcome> {
            self.0
                .borrow_mut()
                .push(format!("{place:?}:{}", argv.join(" ")));
            Ok(match argv[0].as_str() {
                "/fail" => Outcome {
                    status: Some(2),
                    output: "no disk\n".into(),
                    timed_out: false,
                },
                "/hang" => Outcome {
                    status: None,
                    output: String::new(),
                    timed_out: true,
                },
                _ => Outcome {
                    status: Some(0),
                    output: String::new(),
                    timed_out: false,
                },
            })
        }
    }

    fn hook(stage: Stage, program: &str, place: Place) -> HookSpec {
        HookSpec {
            stage,
            command: vec![program.into()],
            place,
            timeout_secs: 7,
        }
    }

    #[test]
    fn hooks_of_the_stage_run_in_order_until_one_fails() {
        let hooks = [
            hook(Stage::PreCheckpoint, "/a", Place::Sandbox),
            hook(Stage::PostRestore, "/other-stage", Place::Sandbox),
            hook(Stage::PreCheckpoint, "/b", Place::Host),
            hook(Stage::PreCheckpoint, "/fail", Place::Sandbox),
            hook(Stage::PreCheckpoint, "/never", Place::Sandbox),
        ];
        let fake = Fake(RefCell::new(Vec::new()));
        let err = run_stage(&hooks, Stage::PreCheckpoint, &fake, &[]).unwrap_err();
        assert_eq!(*fake.0.borrow(), ["Sandbox:/a", "Host:/b", "Sandbox:/fail"]);
        assert_eq!(
            err.to_string(),
            "pre-checkpoint hook [\"/fail\"] failed (exit 2): no disk"
        );
    }

    #[test]
    fn a_timeout_is_named() {
        let hooks = [hook(Stage::PostRestore, "/hang", Place::Sandbox)];
        let fake = Fake(RefCell::new(Vec::new()));
        let err = run_stage(&hooks, Stage::PostRestore, &fake, &[]).unwrap_err();
        assert!(err.to_string().contains("timed out after 7 s"), "{err}");
        assert_eq!(run_stage(&hooks, Stage::PreCheckpoint, &fake, &[]), Ok(0));
    }
}
