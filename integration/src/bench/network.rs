//! What a network of its own adds to a sandbox's operations: the same chalkctl operations on
//! sandboxes with loopback only (`--net none`) and on the default network (`--net chalk`),
//! interleaved run by run so that both see the same machine.

use std::time::Duration;

use super::{report::Plain, stats::summarize, stats::Unit, timed, via_ctr::ViaCtr, COUNTER};
use crate::containerd::IMAGE;

const OPS: [&str; 5] = ["run", "fork --id", "suspend", "resume", "rm"];

/// `reps` runs of run, fork, suspend, resume and rm on each network; no rows, and why, when
/// this host cannot give a sandbox the default network.
pub fn measure(reps: usize, chalk: &ViaCtr) -> Result<Plain, String> {
    // [op][network]: samples in milliseconds.
    let mut samples = vec![[Vec::new(), Vec::new()]; OPS.len()];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for i in 0..reps {
        for (n, net) in ["none", "chalk"].into_iter().enumerate() {
            let id = format!("netb-{net}-{i}");
            let fork = format!("{id}-f");
            chalk.remove(&id);
            chalk.remove(&fork);
            let run = timed(|| {
                chalk.chalkctl(&["run", "--net", net, IMAGE, &id, "--", "sh", "-c", COUNTER])
            });
            let run = match run {
                Ok((t, _)) => t,
                Err(e) if net == "chalk" && i == 0 => {
                    chalk.remove(&id);
                    return Ok(Plain {
                        title: "Networks".into(),
                        about: format!("Not measured: this host cannot give a sandbox the default network ({e})."),
                        rows: Vec::new(),
                    });
                }
                Err(e) => return Err(e),
            };
            let result = (|| {
                chalk.wait_file(&id, "/tmp/count", Duration::from_secs(60))?;
                let (f, _) = timed(|| chalk.chalkctl(&["fork", "--id", &id, "--fork-id", &fork]))?;
                chalk.remove(&fork);
                let (s, _) = chalk.suspend(&id)?;
                let r = chalk.resume(&id)?;
                let (rm, _) = timed(|| chalk.chalkctl(&["rm", "--force", "--id", &id]))?;
                Ok::<_, String>([run, f, s, r, rm])
            })();
            chalk.remove(&fork);
            chalk.remove(&id);
            for (op, t) in result?.into_iter().enumerate() {
                samples[op][n].push(ms(t));
            }
        }
    }
    let median = |v: &[f64]| summarize(v).map_or(0.0, |s| s.median);
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    for (op, [none, net]) in OPS.iter().zip(samples) {
        ratios.push(format!(
            "{op} {:.2}x ({:+.0} ms)",
            median(&net) / median(&none).max(f64::EPSILON),
            median(&net) - median(&none)
        ));
        rows.push((format!("{op}, --net none"), Unit::Millis, none));
        rows.push((format!("{op}, --net chalk"), Unit::Millis, net));
    }
    Ok(Plain {
        title: "Networks".into(),
        about: format!(
            "{reps} runs each, alternating: a counter sandbox made by `chalkctl run --net none` \
             (loopback only) or `--net chalk` (the default network: bridge, host-local, \
             portmap, firewall; NAT through iptables), then `fork --id` (a fresh namespace and \
             address for the fork), `suspend`, `resume` (a fresh address again) and `rm` (DEL). \
             On chalk against loopback only, medians: {}.",
            ratios.join(", ")
        ),
        rows,
    })
}
