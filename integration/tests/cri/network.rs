//! What the node's CNI gives a pod that starts from a snapshot: the new pod's address, inside
//! (its network stack took the new namespace's) and out (reachable there), while the source
//! keeps its own.

use std::time::Duration;

use chalk_integration::network::http_get_within;

use super::*;

/// The CNI node: its own containerd with CRI, pods on a bridge of its own (network 3 of the
/// harness's pod networks). None on Debian's runsc or without the CNI plugins.
pub fn node(old_runsc: bool) -> Option<CriEnv> {
    let cni = std::env::var_os("CHALK_CNI_BIN").filter(|v| !v.is_empty())?;
    if old_runsc {
        return None;
    }
    let c = Containerd::start_cri(chalk_integration::containerd::CriOptions {
        cni_bin: Some(cni.into()),
        network: 3,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("cannot start the CNI node's containerd: {e}"));
    let cri = Cri::connect(&c.socket()).unwrap_or_else(|e| panic!("CRI: {e}"));
    Some(CriEnv {
        env: Env { c },
        cri,
        registry: None,
        crictl: None,
        keys: None,
        net: None,
    })
}

const SERVE: &[&str] = &[
    "/bin/sh",
    "-c",
    "mkdir -p /www && echo served-by-netsrc > /www/index.html && exec httpd -f -p 8080 -h /www",
];

fn page(ip: &str) -> Result<String, Failed> {
    let to = format!("{ip}:8080")
        .parse()
        .map_err(|e| Failed::from(format!("{ip}: {e}")))?;
    Ok(http_get_within(to, "/", Duration::from_secs(10))?)
}

fn eth0(n: &CriEnv, container: &str) -> Result<String, Failed> {
    let r = n.cri.exec_sync(
        container,
        &["ip", "-4", "addr", "show", "eth0"],
        10 * SECOND,
    )?;
    ensure!(r.exit_code == 0, "ip addr in {container}: {r:?}");
    Ok(r.stdout)
}

pub fn a_restored_pod_has_its_new_pods_address(e: &CriEnv) -> TestResult {
    let n = e.net.as_deref().ok_or("no CNI node")?;
    let src = n.cri.run_pod("netsrc", CRI_HANDLER, true)?;
    let web = n.cri.run_container(&src, "web", IMAGE, SERVE)?;
    let src_ip = n.cri.pod_ip(&src)?;
    let served = page(&src_ip)?;
    ensure!(served.trim() == "served-by-netsrc", "{served:?}");
    let snapshot = pod_snapshot(n, &src)?;
    let pod = n.cri.run_pod_with(
        "netrestored",
        CRI_HANDLER,
        true,
        "default",
        &[(RESTORE_FROM, &snapshot)],
    )?;
    let web2 = n.cri.run_container(&pod, "web", IMAGE, SERVE)?;
    let ip = n.cri.pod_ip(&pod)?;
    ensure!(
        ip != src_ip,
        "the restored pod has its source's address {ip}"
    );
    let inside = eth0(n, &web2)?;
    ensure!(
        inside.contains(&format!("inet {ip}/")) && !inside.contains(&format!("inet {src_ip}/")),
        "the restored pod's network stack should have its new address {ip}: {inside}"
    );
    // Out: the restored server answers on the new address, the source on its own.
    let served = page(&ip)?;
    ensure!(served.trim() == "served-by-netsrc", "{served:?}");
    let served = page(&src_ip)?;
    ensure!(
        served.trim() == "served-by-netsrc",
        "the source: {served:?}"
    );
    ensure!(
        eth0(n, &web)?.contains(&format!("inet {src_ip}/")),
        "the source moved"
    );
    testkit::note(format!("source pod {src_ip}, restored pod {ip}"));
    n.stop_and_remove(&pod)?;
    n.stop_and_remove(&src)?;
    n.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    // CRI's DEL found what its ADD made (runsc had taken the addresses off the interfaces
    // the bridge plugin finds its NAT rules by): nothing of either pod's network is left.
    for p in [&src, &pod] {
        let left = chalk_integration::network::leftovers(p);
        ensure!(left.is_empty(), "pod {p} left: {left:?}");
    }
    Ok(())
}
