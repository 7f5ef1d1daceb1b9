//! A sandbox that resumes on another host is on that host's network: an address from B's
//! subnet, B's gateway as its route out, reachable there.

use std::time::Duration;

use chalk_integration::network::http_get_within;

use super::*;

/// B's `chalk` network (the default one, written by the test as B's operator would).
pub const B_NETWORK: (&str, &str, &str) = ("chalkb0", "10.78.0.0/16", "10.78.0.1");

/// Writes host `c`'s default network with bridge, subnet and gateway `net`.
pub fn write_network(c: &Containerd, net: (&str, &str, &str)) -> Result<(), String> {
    let dir = chalk_integration::containerd::network_conf_dir(c.dir());
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let list = chalk_runtime::network::conflist::default_conflist("chalk", net.1);
    let mut list = list;
    list["plugins"][0]["bridge"] = net.0.into();
    std::fs::write(dir.join("chalk.conflist"), list.to_string()).map_err(|e| e.to_string())
}

fn address(h: &Hosts, host: &Env, id: &str) -> Result<String, Failed> {
    let v = h.json(host, &["get", "--id", id])?;
    v["address"]
        .as_str()
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Failed::from(format!("{id} has no address: {v}")))
}

pub fn a_resume_on_another_host_gets_an_address_there(h: &Hosts) -> TestResult {
    let id = "tr-net";
    h.a.remove(id);
    h.b.remove(id);
    let result = (|| {
        let serve = "mkdir -p /www && echo served-by-tr-net > /www/index.html && \
                     exec httpd -f -p 8080 -h /www";
        let out = h.chalkctl(&h.a, &["run", IMAGE, id, "--", "sh", "-c", serve]);
        ensure!(out.code == 0, "run on A: {out:?}");
        let on_a = address(h, &h.a, id)?;
        ensure!(on_a.starts_with("10.77."), "A's address: {on_a}");
        let reference = h.reference("travel/tr-net:suspended");
        h.suspend_to(&h.a, id, &reference)?;
        let started = std::time::Instant::now();
        let out = h.chalkctl(&h.b, &["resume", "--id", id, "--from", &reference]);
        ensure!(out.code == 0, "resume on B: {out:?}");
        testkit::note(format!(
            "resume on B with its network: {} ms",
            started.elapsed().as_millis()
        ));
        let on_b = address(h, &h.b, id)?;
        ensure!(
            on_b.starts_with("10.78."),
            "B's address should be from B's subnet: {on_b}"
        );
        let inside = h.chalkctl(
            &h.b,
            &[
                "exec",
                "--id",
                id,
                "--",
                "sh",
                "-c",
                "ip -4 addr show eth0; ip route",
            ],
        );
        ensure!(
            inside.stdout.contains(&format!("inet {on_b}/16"))
                && !inside.stdout.contains(&format!("inet {on_a}/"))
                && inside
                    .stdout
                    .contains(&format!("default via {}", B_NETWORK.2)),
            "inside on B: {inside:?}"
        );
        // B reaches it on its new address (B's bridge is the host's way to its subnet).
        let to = format!("{on_b}:8080")
            .parse()
            .map_err(|e| Failed::from(format!("{e}")))?;
        let page = http_get_within(to, "/", Duration::from_secs(10))?;
        ensure!(page.trim() == "served-by-tr-net", "{page:?}");
        Ok(())
    })();
    h.a.remove(id);
    h.b.conclude(result, &[id], &[])
}
