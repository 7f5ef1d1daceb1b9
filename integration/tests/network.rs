//! Sandboxes with networks of their own: a private containerd whose shim attaches chalkctl's
//! sandboxes to CNI networks through the real CNI plugins (`CHALK_CNI_BIN`, built by
//! scripts/peers), a server of the test's own in a network namespace on the default
//! network's bridge, and checks from both sides. Where the cell's runsc cannot give a
//! sandbox a network (Debian's 2022 build on this kernel), the refusal is what is tested.

use std::{net::SocketAddr, time::Duration};

use chalk_integration::{
    cases,
    containerd::IMAGE,
    ensure,
    network::{self, http_get, in_netns, ServerNetns, GATEWAY, SERVER_IP},
    testkit::{self, Env, Failed, TestResult},
    Containerd,
};
use serde_json::Value;

#[path = "network/forks.rs"]
mod forks;

/// The shared containerd, and the test's server on the default network's bridge.
pub struct Net {
    e: Env,
    server: Option<ServerNetns>,
}

impl Net {
    fn server(&self) -> Result<&ServerNetns, Failed> {
        self.server
            .as_ref()
            .ok_or_else(|| Failed::from("no test server (the cell cannot have networks)"))
    }
}

fn main() {
    testkit::check_args();
    let c = Containerd::start().unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
    c.import_busybox()
        .unwrap_or_else(|e| panic!("cannot import the busybox image: {e}"));
    let networks = testkit::current_runsc() && std::env::var_os("CHALK_CNI_BIN").is_some();
    let server = networks.then(|| {
        ServerNetns::start("srv", network::BRIDGE, SERVER_IP, GATEWAY)
            .unwrap_or_else(|e| panic!("cannot start the test's server: {e}"))
    });
    let env = Net {
        e: Env { c },
        server,
    };
    let all = cases![
        a_sandbox_reaches_a_server_and_publishes_a_port,
        forks::three_forks_get_three_addresses,
        forks::a_forks_open_connection_is_reset_not_duplicated,
        forks::a_sandbox_without_a_network_forks_into_none,
        forks::a_resume_here_keeps_its_address_when_free,
        rm_and_exit_leave_no_network_behind,
        a_failed_create_leaves_no_network_behind,
        bad_input_networks_and_ports_are_refused_by_name,
    ]
    .into_iter()
    .map(|c| c.ignored_if(!networks))
    .chain(
        cases![a_runsc_without_networks_is_refused_by_name]
            .into_iter()
            .map(|c| c.ignored_if(networks)),
    )
    .collect();
    testkit::run(env, all, |_| Ok(()));
}

/// `chalkctl get` of `id`.
pub fn get(e: &Env, id: &str) -> Result<Value, Failed> {
    e.chalkctl_json(&["get", "--id", id])
}

/// The address of running sandbox `id`.
pub fn address(e: &Env, id: &str) -> Result<String, Failed> {
    let v = get(e, id)?;
    v["address"]
        .as_str()
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Failed::from(format!("{id} has no address: {v}")))
}

/// Runs `id` from busybox with `args` before the image, `cmd` after `--`.
pub fn run(e: &Env, id: &str, args: &[&str], cmd: &[&str]) -> Result<Value, Failed> {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[IMAGE, id, "--"]);
    all.extend_from_slice(cmd);
    e.chalkctl_json(&all)
}

/// Runs `script` in sandbox `id` through chalkctl exec; its output, or why not.
pub fn exec(e: &Env, id: &str, script: &str) -> Result<String, Failed> {
    let out = e.chalkctl(&["exec", "--id", id, "--", "sh", "-c", script]);
    ensure!(out.code == 0, "exec in {id}: {script}: {out:?}");
    Ok(out.stdout)
}

/// Sandbox `id` fetches the test server's file.
pub fn fetches_from_server(e: &Env, id: &str) -> TestResult {
    let fetched = exec(
        e,
        id,
        &format!("wget -q -O - http://{SERVER_IP}:8000/file.txt"),
    )?;
    ensure!(
        fetched.trim() == "served-from-the-test-netns",
        "{id}: {fetched:?}"
    );
    Ok(())
}

/// An HTTP server in the sandbox on port 8080, serving a page that names `who`.
pub fn httpd(who: &str) -> String {
    format!(
        "mkdir -p /www && echo served-by-{who} > /www/index.html && exec httpd -f -p 8080 -h /www"
    )
}

/// GET from the test's server namespace.
pub fn get_from_server(net: &Net, addr: &str, port: u16, path: &str) -> Result<String, Failed> {
    let to: SocketAddr = format!("{addr}:{port}")
        .parse()
        .map_err(|e| Failed::from(format!("{addr}: {e}")))?;
    let path = path.to_string();
    in_netns(&net.server()?.path(), move || http_get(to, &path))?.map_err(Failed::from)
}

/// Retries `f` for up to `limit` (a server in a sandbox takes a moment to listen).
pub fn eventually<T>(
    limit: Duration,
    mut f: impl FnMut() -> Result<T, Failed>,
) -> Result<T, Failed> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn a_sandbox_reaches_a_server_and_publishes_a_port(net: &Net) -> TestResult {
    let e = &net.e;
    let id = "net-web";
    e.remove(id);
    let result = (|| {
        let started = run(e, id, &["-p", "18080:8080"], &["sh", "-c", &httpd("web")])?;
        let addr = address(e, id)?;
        ensure!(
            started["address"] == addr.as_str(),
            "run said {started}, get says {addr}"
        );
        ensure!(
            addr.starts_with("10.77."),
            "not on the default network: {addr}"
        );
        let conf = network::default_conflist_path(e.c.dir());
        ensure!(
            conf.exists(),
            "the default network was not written to {}",
            conf.display()
        );
        // Inside: its own address, a route out, resolv.conf, and the server's file.
        let inside = exec(
            e,
            id,
            "ip -4 addr show eth0; ip route; cat /etc/resolv.conf /etc/hosts",
        )?;
        ensure!(inside.contains(&format!("inet {addr}/16")), "{inside}");
        ensure!(
            inside.contains(&format!("default via {GATEWAY}")),
            "{inside}"
        );
        ensure!(inside.contains("nameserver"), "no resolv.conf: {inside}");
        ensure!(
            inside.contains(&format!("{addr}\t{id}")),
            "no hosts entry: {inside}"
        );
        fetches_from_server(e, id)?;
        // Its server from the test's namespace, directly and through the published port.
        let direct = eventually(Duration::from_secs(10), || {
            get_from_server(net, &addr, 8080, "/")
        })?;
        ensure!(direct.trim() == "served-by-web", "{direct:?}");
        let published = get_from_server(net, GATEWAY, 18080, "/")?;
        ensure!(published.trim() == "served-by-web", "{published:?}");
        let v = get(e, id)?;
        ensure!(
            v["network"] == "chalk" && v["ports"] == "18080:8080/tcp",
            "{v}"
        );
        Ok(())
    })();
    e.conclude(result, &[id], &[])
}

fn rm_and_exit_leave_no_network_behind(net: &Net) -> TestResult {
    let e = &net.e;
    let (kept, ends) = ("net-rm", "net-exit");
    e.remove(kept);
    e.remove(ends);
    let result = (|| {
        run(e, kept, &["-p", "18081:8080"], &["sh", "-c", &httpd("rm")])?;
        let cni = network::cni_id(&e.c.namespace, kept);
        let veth = network::host_veth(&e.bundle(kept)).ok_or("no veth in the record")?;
        let traces = network::leftovers(&cni);
        ensure!(
            traces.iter().any(|t| t.contains("lease"))
                && traces.iter().any(|t| t.contains("iptables")),
            "a running sandbox should hold a lease and NAT/port rules: {traces:?}"
        );
        let out = e.chalkctl(&["rm", "--force", "--id", kept]);
        ensure!(out.code == 0, "rm: {out:?}");
        e.assert_clean(kept)?;
        ensure!(
            !std::path::Path::new("/sys/class/net").join(&veth).exists(),
            "{veth} is left"
        );

        // An exit: the network goes with the sandbox, before anyone removes it.
        run(
            e,
            ends,
            &["-p", "18082:8080"],
            &["sh", "-c", "sleep 1; exit 3"],
        )?;
        let cni = network::cni_id(&e.c.namespace, ends);
        let waited = e.chalkctl(&["wait", "--id", ends, "--timeout", "30"]);
        ensure!(
            waited.stdout.contains('3'),
            "exit status not reported: {waited:?}"
        );
        // The shim releases the network off the exit's thread: the CNI DEL, then the
        // namespace. Both are waited for (checking the namespace once, right after the CNI
        // state went, lost that race under load).
        let netns =
            chalk_runtime::netns::netns_path(&e.c.dir().join("runsc"), &e.c.namespace, ends);
        let gone = eventually(Duration::from_secs(10), || {
            let left = network::leftovers(&cni);
            ensure!(left.is_empty(), "after its exit: {left:?}");
            ensure!(!netns.exists(), "its namespace is left after its exit");
            Ok(())
        });
        gone?;
        Ok(())
    })();
    e.conclude(result, &[kept, ends], &[])
}

fn bad_input_networks_and_ports_are_refused_by_name(net: &Net) -> TestResult {
    let e = &net.e;
    let id = "net-bad";
    e.remove(id);
    let cases: [(&[&str], &str); 4] = [
        (&["--net", "nosuch"], "no CNI network named \"nosuch\""),
        (&["--net", "../x"], "network name"),
        (&["--net", "none", "-p", "80:80"], "--net none"),
        (&["-p", "99999:80"], "ports are numbers"),
    ];
    for (args, says) in cases {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[IMAGE, id, "--", "sleep", "100"]);
        let out = e.chalkctl(&all);
        ensure!(
            out.code != 0 && out.stderr.contains(says),
            "{args:?}: {out:?}"
        );
        e.assert_clean(id)?;
        e.remove(id);
    }
    Ok(())
}

fn a_runsc_without_networks_is_refused_by_name(net: &Net) -> TestResult {
    let e = &net.e;
    let (asked, default) = ("net-asked", "net-default");
    e.remove(asked);
    e.remove(default);
    let result = (|| {
        let out = e.chalkctl(&["run", "--net", "chalk", IMAGE, asked, "--", "sleep", "100"]);
        // The runsc is refused first, whether or not CNI plugins are installed.
        ensure!(
            out.code != 0
                && out
                    .stderr
                    .contains("cannot give a sandbox one on this host"),
            "an explicit network on this runsc: {out:?}"
        );
        e.assert_clean(asked)?;
        // The default network is left out, and the sandbox says why.
        let started = run(e, default, &[], &["sleep", "100"])?;
        ensure!(started["no_network_because"].is_string(), "{started}");
        let v = get(e, default)?;
        ensure!(
            v["network"] == "none" && v["no_network_because"].is_string(),
            "{v}"
        );
        let inside = exec(e, default, "ip -4 addr")?;
        ensure!(!inside.contains("eth0"), "loopback only: {inside}");
        Ok(())
    })();
    e.conclude(result, &[asked, default], &[])
}

/// A create that fails after its network was attached (no such executable) leaves nothing
/// of the network behind.
fn a_failed_create_leaves_no_network_behind(net: &Net) -> TestResult {
    let e = &net.e;
    let id = "net-fails";
    e.remove(id);
    let out = e.chalkctl(&["run", "-p", "18095:80", IMAGE, id, "--", "/no/such/program"]);
    ensure!(
        out.code != 0 && out.stderr.contains("/no/such/program"),
        "a sandbox without its program: {out:?}"
    );
    e.assert_clean(id)?;
    let left = network::leftovers(&network::cni_id(&e.c.namespace, id));
    ensure!(left.is_empty(), "{left:?}");
    Ok(())
}
