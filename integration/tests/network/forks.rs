//! A fork is a new machine on its source's network: an address of its own, reachable, and
//! no connection of its source's carried into it.

use std::{
    io::Read,
    net::TcpListener,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::*;

pub fn three_forks_get_three_addresses(net: &Net) -> TestResult {
    let e = &net.e;
    let src = "net-src";
    let forks = ["nf-1", "nf-2", "nf-3"];
    e.remove(src);
    for f in forks {
        e.remove(f);
    }
    let result = (|| {
        run(e, src, &["-p", "18083:8080"], &["sh", "-c", &httpd("src")])?;
        let src_addr = address(e, src)?;
        eventually(Duration::from_secs(10), || {
            get_from_server(net, &src_addr, 8080, "/")
        })?;
        let out = e.chalkctl_json(&["fork", "--id", src, "--fork-id", "nf", "--count", "3"])?;
        ensure!(out.to_string().contains("nf-3"), "fork: {out}");
        let mut seen = vec![src_addr.clone()];
        for f in forks {
            let addr = address(e, f)?;
            ensure!(
                !seen.contains(&addr),
                "{f} has an address already taken: {addr} ({seen:?})"
            );
            seen.push(addr.clone());
            let inside = exec(e, f, "ip -4 addr show eth0")?;
            ensure!(
                inside.contains(&format!("inet {addr}/"))
                    && !inside.contains(&format!("inet {src_addr}/")),
                "{f} ({addr}) sees: {inside}"
            );
            fetches_from_server(e, f)?;
            let page = eventually(Duration::from_secs(10), || {
                get_from_server(net, &addr, 8080, "/")
            })?;
            ensure!(page.trim() == "served-by-src", "{f}'s server: {page:?}");
            // Its source's ports are its source's.
            let v = get(e, f)?;
            ensure!(v["ports"].is_null() && v["network"] == "chalk", "{f}: {v}");
        }
        // The source still answers on its own address and port.
        let page = get_from_server(net, GATEWAY, 18083, "/")?;
        ensure!(page.trim() == "served-by-src", "{page:?}");
        testkit::note(format!("addresses: {}", seen.join(" ")));
        Ok(())
    })();
    let mut ids = vec![src];
    ids.extend(forks);
    e.conclude(result, &ids, &[])
}

/// What the test's listener saw: each connection's peer, what it sent, whether it ended.
#[derive(Default)]
struct Seen {
    peers: Vec<(String, String, bool)>,
}

pub fn a_forks_open_connection_is_reset_not_duplicated(net: &Net) -> TestResult {
    let e = &net.e;
    let (src, fork) = ("net-conn", "net-conn-fork");
    e.remove(src);
    e.remove(fork);
    let listener = in_netns(&net.server()?.path(), || {
        TcpListener::bind(format!("{SERVER_IP}:9000"))
    })?
    .map_err(|e| Failed::from(format!("listen: {e}")))?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    {
        let seen = seen.clone();
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(mut s) = stream else { return };
                let peer = s
                    .peer_addr()
                    .map(|p| p.ip().to_string())
                    .unwrap_or_default();
                seen.lock()
                    .unwrap()
                    .peers
                    .push((peer, String::new(), false));
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 256];
                    loop {
                        match s.read(&mut buf) {
                            Ok(n) if n > 0 => seen.lock().unwrap().peers[i]
                                .1
                                .push_str(&String::from_utf8_lossy(&buf[..n])),
                            _ => break,
                        }
                    }
                    seen.lock().unwrap().peers[i].2 = true;
                });
            }
        });
    }
    let result = (|| {
        // The init holds a connection open to the test's server, sending each second what
        // its address is now, and notes when the connection ends.
        let script = format!(
            "(echo hello; while true; do sleep 1; echo \"tick $(ip -4 -o addr show eth0 | \
             awk '{{print $4}}')\"; done) | nc {SERVER_IP} 9000; echo ended > /tmp/nc-ended; \
             sleep 100000"
        );
        run(e, src, &[], &["sh", "-c", &script])?;
        let src_addr = address(e, src)?;
        eventually(Duration::from_secs(10), || {
            let s = seen.lock().unwrap();
            ensure!(
                s.peers.len() == 1 && s.peers[0].1.contains("hello"),
                "{:?}",
                s.peers
            );
            Ok(())
        })?;
        e.chalkctl_json(&["fork", "--id", src, "--fork-id", fork])?;
        let fork_addr = address(e, fork)?;
        // The fork's copy of the connection is reset: its nc ends.
        let ended = eventually(Duration::from_secs(20), || {
            let out = e.chalkctl(&["exec", "--id", fork, "--", "cat", "/tmp/nc-ended"]);
            ensure!(
                out.stdout.contains("ended"),
                "the fork's connection is still open"
            );
            Ok(())
        });
        ended?;
        std::thread::sleep(Duration::from_secs(2));
        let s = seen.lock().unwrap();
        ensure!(
            s.peers.iter().all(|(p, _, _)| p == &src_addr),
            "a connection came from elsewhere than the source ({src_addr}; fork {fork_addr}): {:?}",
            s.peers
        );
        ensure!(
            s.peers.len() == 1,
            "the connection was made again: {:?}",
            s.peers
        );
        let (_, said, closed) = &s.peers[0];
        ensure!(
            !said.contains(&format!("tick {fork_addr}/")),
            "the fork's copy of the connection sent into the source's: {said:?}"
        );
        ensure!(
            !closed && said.contains(&format!("tick {src_addr}/")),
            "the source's own connection should carry on: {said:?}"
        );
        Ok(())
    })();
    e.conclude(result, &[src, fork], &[])
}

/// A sandbox with loopback only forks into loopback only, and its fork may not publish.
pub fn a_sandbox_without_a_network_forks_into_none(net: &Net) -> TestResult {
    let e = &net.e;
    let (src, fork) = ("net-none", "net-none-f");
    e.remove(src);
    e.remove(fork);
    let result = (|| {
        run(e, src, &["--net", "none"], &["sleep", "100000"])?;
        let refused = e.chalkctl(&["fork", "--id", src, "--fork-id", fork, "-p", "18090:80"]);
        ensure!(
            refused.code != 0 && refused.stderr.contains("no network"),
            "a fork publishing from a sandbox without a network: {refused:?}"
        );
        e.remove(fork);
        e.chalkctl_json(&["fork", "--id", src, "--fork-id", fork])?;
        let v = get(e, fork)?;
        ensure!(v["network"] == "none" && v["address"].is_null(), "{v}");
        let inside = exec(e, fork, "ip -4 addr")?;
        ensure!(!inside.contains("eth0"), "loopback only: {inside}");
        Ok(())
    })();
    e.conclude(result, &[src, fork], &[])
}

/// A sandbox suspended and resumed on its host takes its own address again (it is free).
pub fn a_resume_here_keeps_its_address_when_free(net: &Net) -> TestResult {
    let e = &net.e;
    let id = "net-back";
    e.remove(id);
    let result = (|| {
        run(e, id, &[], &["sh", "-c", &httpd("back")])?;
        let before = address(e, id)?;
        e.chalkctl_json(&["suspend", "--id", id])?;
        e.chalkctl_json(&["resume", "--id", id])?;
        let after = address(e, id)?;
        ensure!(after == before, "resumed at {after}, was at {before}");
        let inside = exec(e, id, "ip -4 addr show eth0")?;
        ensure!(inside.contains(&format!("inet {after}/")), "{inside}");
        let page = eventually(Duration::from_secs(10), || {
            get_from_server(net, &after, 8080, "/")
        })?;
        ensure!(page.trim() == "served-by-back", "{page:?}");
        Ok(())
    })();
    e.conclude(result, &[id], &[])
}
