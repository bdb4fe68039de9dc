//! The [`Testbed`] handle: builds the namespaces, bridges and veth
//! "cables" of a [`TestbedSpec`] through netlink, injects the faults of
//! TESTBED.md's fault table, runs processes inside nodes, and tears it all
//! down on drop (also on panic).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::TryStreamExt;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, State};
use rtnetlink::{Handle, LinkBridge, LinkMessageBuilder, LinkUnspec, LinkVeth};

use crate::cleanup::{forget_testbed, register_testbed, sweep, OWNER_DIR};
use crate::leaf::{self, LeafSplit, TestbedOptions, UplinkStats};
use crate::netns::{self, Netns};
use crate::plan::{mgmt_addr, rail_addr, Node, TestbedSpec, NS_PREFIX};

/// Root is needed for namespaces. Returns `Ok(false)` to skip (printing
/// `SKIPPED (needs root): name`) outside CI; fails when `CI` is set.
pub fn require_root(test_name: &str) -> anyhow::Result<bool> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(true);
    }
    if std::env::var_os("CI").is_some() {
        bail!("{test_name} needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and CI is set: failing instead of skipping");
    }
    eprintln!("SKIPPED (needs root): {test_name}");
    Ok(false)
}

/// A built testbed. Dropping it kills its processes and removes its
/// namespaces (with everything in them).
pub struct Testbed {
    pub prefix: String,
    pub spec: TestbedSpec,
    /// The optional parts this testbed was built with.
    pub options: TestbedOptions,
    pub fab: Netns,
    pub supervisors: Vec<Netns>,
    pub hosts: Vec<Netns>,
    handles: BTreeMap<String, Handle>,
    children: Mutex<Vec<(Node, Child)>>,
    torn_down: bool,
}

async fn link_index(h: &Handle, name: &str) -> anyhow::Result<u32> {
    let mut links = h.link().get().match_name(name.to_string()).execute();
    match links
        .try_next()
        .await
        .with_context(|| format!("find link {name}"))?
    {
        Some(l) => Ok(l.header.index),
        None => bail!("no link {name}"),
    }
}

async fn set_up(h: &Handle, name: &str, up: bool) -> anyhow::Result<()> {
    set_index_up(h, link_index(h, name).await?, name, up).await
}

async fn set_index_up(h: &Handle, idx: u32, name: &str, up: bool) -> anyhow::Result<()> {
    let b = LinkUnspec::new_with_index(idx);
    let msg = if up { b.up() } else { b.down() }.build();
    h.link()
        .set(msg)
        .execute()
        .await
        .with_context(|| format!("set {name} {}", if up { "up" } else { "down" }))
}

/// Wall-clock nanoseconds since the Unix epoch.
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Makes `port` a port of `bridge` and sets it up; returns its index.
async fn attach_up(h: &Handle, port: &str, bridge: &str) -> anyhow::Result<u32> {
    let br_idx = link_index(h, bridge).await?;
    let idx = link_index(h, port).await?;
    h.link()
        .set(
            LinkUnspec::new_with_index(idx)
                .controller(br_idx)
                .up()
                .build(),
        )
        .execute()
        .await
        .with_context(|| format!("attach {port} to {bridge}"))?;
    Ok(idx)
}

/// Which end of a host's cable a flap is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host's own NIC set admin down (the host sees it down).
    Host,
    /// The fabric-side veth set down (the host sees carrier loss).
    Fabric,
}

/// A flap storm on one cable (bounded: at most 10,000 cycles).
#[derive(Debug, Clone, Copy)]
pub struct FlapPattern {
    pub host: usize,
    pub rail: usize,
    pub side: Side,
    pub count: usize,
    /// How long each flap keeps the link down.
    pub down: Duration,
    /// Pause between flaps, plus a random 0..jitter.
    pub gap: Duration,
    pub jitter: Duration,
}

/// Link state as netlink reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    pub admin_up: bool,
    pub oper_up: bool,
    pub carrier: bool,
    pub carrier_changes: u32,
}

impl Testbed {
    /// Builds the topology. On any error everything made so far is removed.
    pub async fn build(spec: TestbedSpec) -> anyhow::Result<Testbed> {
        Self::build_with(spec, TestbedOptions::default()).await
    }

    /// Builds the topology with optional parts (a leaf split). On any
    /// error everything made so far is removed.
    pub async fn build_with(spec: TestbedSpec, options: TestbedOptions) -> anyhow::Result<Testbed> {
        if spec.hosts > 200 || spec.supervisors > 9 {
            bail!("testbed too large: at most 200 hosts and 9 supervisors");
        }
        leaf::validate_splits(&options.leaf_splits, spec.hosts)?;
        sweep();
        let suffix: u32 = rand::random::<u32>() % 36u32.pow(5);
        let prefix = format!("{NS_PREFIX}{}", radix36(suffix));
        std::fs::create_dir_all(OWNER_DIR)?;
        std::fs::write(
            format!("{OWNER_DIR}/{prefix}.owner"),
            std::process::id().to_string(),
        )?;
        let fab = Netns::create(&format!("{prefix}-fab")).context("create fabric namespace")?;
        let mut tb = Testbed {
            prefix: prefix.clone(),
            spec,
            options,
            fab,
            supervisors: Vec::new(),
            hosts: Vec::new(),
            handles: BTreeMap::new(),
            children: Mutex::new(Vec::new()),
            torn_down: false,
        };
        tb.register();
        // From here on, Drop cleans up whatever fails.
        for i in 0..spec.supervisors {
            let ns = Netns::create(&format!("{prefix}-s{i}"))?;
            tb.supervisors.push(ns);
            tb.register();
        }
        for i in 0..spec.hosts {
            let ns = Netns::create(&format!("{prefix}-h{i}"))?;
            tb.hosts.push(ns);
            tb.register();
        }
        tb.wire().await?;
        Ok(tb)
    }

    fn register(&self) {
        register_testbed(self.namespace_names(), self.pids());
    }

    fn pids(&self) -> Vec<u32> {
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, c)| c.id())
            .collect()
    }

    /// Every namespace of this testbed (fabric first).
    pub fn namespace_names(&self) -> Vec<String> {
        std::iter::once(self.fab.name.clone())
            .chain(self.supervisors.iter().map(|n| n.name.clone()))
            .chain(self.hosts.iter().map(|n| n.name.clone()))
            .collect()
    }

    /// The namespace of `node`.
    pub fn ns(&self, node: Node) -> &Netns {
        match node {
            Node::Supervisor(i) => &self.supervisors[i],
            Node::Host(i) => &self.hosts[i],
        }
    }

    fn handle(&mut self, ns_name: &str) -> anyhow::Result<Handle> {
        if let Some(h) = self.handles.get(ns_name) {
            return Ok(h.clone());
        }
        let ns = Netns::open(ns_name)?;
        let h = ns.netlink()?;
        self.handles.insert(ns_name.to_string(), h.clone());
        Ok(h)
    }

    /// The fabric bridge host `host`'s `rail<rail>` cable attaches to.
    pub fn rail_bridge(&self, host: usize, rail: usize) -> String {
        match self.options.leaf_splits.iter().find(|s| s.rail == rail) {
            Some(s) => s.bridge(s.leaf_of(host)),
            None => format!("rail{rail}"),
        }
    }

    async fn wire(&mut self) -> anyhow::Result<()> {
        let fab_name = self.fab.name.clone();
        let fab = self.handle(&fab_name)?;
        set_up(&fab, "lo", true).await?;
        let mut bridges = vec!["mgmt".to_string(), "rail0".into(), "rail1".into()];
        for s in &self.options.leaf_splits {
            bridges.push(s.bridge(1));
        }
        for br in &bridges {
            fab.link()
                .add(LinkBridge::new(br).build())
                .execute()
                .await
                .with_context(|| format!("create bridge {br}"))?;
            set_up(&fab, br, true).await?;
        }
        let mut cables: Vec<(Node, String, String, String, Ipv4Addr)> = Vec::new();
        for i in 0..self.spec.supervisors {
            cables.push((
                Node::Supervisor(i),
                format!("s{i}m"),
                "mgmt0".into(),
                "mgmt".into(),
                mgmt_addr(Node::Supervisor(i)),
            ));
        }
        for i in 0..self.spec.hosts {
            cables.push((
                Node::Host(i),
                format!("h{i}m"),
                "mgmt0".into(),
                "mgmt".into(),
                mgmt_addr(Node::Host(i)),
            ));
            for r in 0..2 {
                cables.push((
                    Node::Host(i),
                    format!("h{i}r{r}"),
                    format!("rail{r}"),
                    self.rail_bridge(i, r),
                    rail_addr(i, r),
                ));
            }
        }
        for (node, fab_end, node_end, bridge, addr) in cables {
            let node_ns_name = self.ns(node).name.clone();
            let node_fd = self.ns(node).fd();
            // Create the pair in the fabric with the node's end placed
            // directly in the node's namespace under its final name.
            let peer = LinkMessageBuilder::<LinkUnspec>::new()
                .name(node_end.clone())
                .setns_by_fd(node_fd)
                .build();
            let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
                .name(fab_end.clone())
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
                .build();
            fab.link()
                .add(msg)
                .execute()
                .await
                .with_context(|| format!("create cable {fab_end} <-> {node_ns_name}/{node_end}"))?;
            attach_up(&fab, &fab_end, &bridge).await?;
            let nh = self.handle(&node_ns_name)?;
            let nidx = link_index(&nh, &node_end).await?;
            nh.address()
                .add(nidx, addr.into(), 16)
                .execute()
                .await
                .with_context(|| format!("address {addr} on {node_ns_name}/{node_end}"))?;
            set_up(&nh, &node_end, true).await?;
        }
        for n in self.namespace_names().into_iter().skip(1) {
            let h = self.handle(&n)?;
            set_up(&h, "lo", true).await?;
        }
        for s in &self.options.leaf_splits {
            self.wire_uplink(&fab, s).await?;
        }
        Ok(())
    }

    /// The leaf split's uplink: a veth pair between the two leaf bridges,
    /// each end a root HTB whose default class has rate = ceil = the
    /// uplink rate, so each direction queues at its sending end.
    async fn wire_uplink(&self, fab: &Handle, s: &LeafSplit) -> anyhow::Result<()> {
        let (a, b) = s.uplink_ends();
        fab.link()
            .add(LinkVeth::new(&a, &b).build())
            .execute()
            .await
            .with_context(|| format!("create uplink {a} <-> {b}"))?;
        for (end, leaf) in [(&a, 0), (&b, 1)] {
            let idx = attach_up(fab, end, &s.bridge(leaf)).await?;
            tc_htb::apply(fab, idx, &[], s.uplink_bps)
                .await
                .with_context(|| format!("shape uplink end {end} to {} bit/s", s.uplink_bps))?;
        }
        tracing::info!(
            prefix = %self.prefix,
            rail = s.rail,
            leaf1_hosts = ?s.right,
            uplink_bps = s.uplink_bps,
            "leaf split wired"
        );
        Ok(())
    }

    /// The topology this testbed was built with (hosts named by
    /// [`crate::plan::host_name`]), for the supervisor's `--topology`.
    pub fn topology(&self) -> supervisor::topology::TopologyFile {
        leaf::topology(self.spec.hosts, &self.options.leaf_splits)
    }

    /// Bytes each end of the (first) leaf split's uplink has transmitted
    /// (one direction each). Fails when the testbed has no split.
    pub async fn uplink_stats(&mut self) -> anyhow::Result<UplinkStats> {
        let (a, b) = self.uplink_ends()?;
        let fab = self.fab.name.clone();
        Ok(UplinkStats {
            leaf0_to_leaf1_bytes: self.link_tx_bytes(&fab, &a).await?,
            leaf1_to_leaf0_bytes: self.link_tx_bytes(&fab, &b).await?,
        })
    }

    /// What our HTB code reads back from each end of the (first) split's
    /// uplink (leaf 0's, leaf 1's): qdisc, classes with their counters.
    /// Fails without a split.
    pub async fn uplink_shaping(
        &mut self,
    ) -> anyhow::Result<(tc_htb::Installed, tc_htb::Installed)> {
        let (a, b) = self.uplink_ends()?;
        let fab_name = self.fab.name.clone();
        let fab = self.handle(&fab_name)?;
        let mut dumps = Vec::with_capacity(2);
        for end in [&a, &b] {
            let idx = link_index(&fab, end).await?;
            let i = tc_htb::list(&fab, idx)
                .await
                .with_context(|| format!("dump qdisc of uplink end {end}"))?;
            dumps.push(i);
        }
        let [a, b]: [tc_htb::Installed; 2] = dumps.try_into().expect("one dump per end");
        Ok((a, b))
    }

    /// Dumps our HTB shaping on host `host`'s `rail<rail>` (empty when
    /// nothing is installed).
    pub async fn nic_shaping(
        &mut self,
        host: usize,
        rail: usize,
    ) -> anyhow::Result<tc_htb::Installed> {
        let ns = self.ns(Node::Host(host)).name.clone();
        let h = self.handle(&ns)?;
        let nic = format!("rail{rail}");
        let idx = link_index(&h, &nic).await?;
        tc_htb::list(&h, idx)
            .await
            .with_context(|| format!("dump qdisc of h{host}/{nic}"))
    }

    fn uplink_ends(&self) -> anyhow::Result<(String, String)> {
        match self.options.leaf_splits.first() {
            Some(s) => Ok(s.uplink_ends()),
            None => bail!("testbed {} has no leaf split (no uplink)", self.prefix),
        }
    }

    /// Reads a link's state in a namespace.
    pub async fn link_status(&mut self, ns_name: &str, link: &str) -> anyhow::Result<LinkStatus> {
        let h = self.handle(ns_name)?;
        let mut links = h.link().get().match_name(link.to_string()).execute();
        let Some(l) = links.try_next().await? else {
            bail!("no link {link} in {ns_name}")
        };
        let mut s = LinkStatus {
            admin_up: l
                .header
                .flags
                .contains(netlink_packet_route::link::LinkFlags::Up),
            oper_up: false,
            carrier: false,
            carrier_changes: 0,
        };
        for a in l.attributes {
            match a {
                LinkAttribute::OperState(st) => s.oper_up = st == State::Up,
                LinkAttribute::Carrier(c) => s.carrier = c != 0,
                LinkAttribute::CarrierChanges(c) => s.carrier_changes = c,
                _ => {}
            }
        }
        Ok(s)
    }

    /// Bytes a link has transmitted (its 64-bit kernel counters).
    pub async fn link_tx_bytes(&mut self, ns_name: &str, link: &str) -> anyhow::Result<u64> {
        let h = self.handle(ns_name)?;
        let mut links = h.link().get().match_name(link.to_string()).execute();
        let Some(l) = links.try_next().await? else {
            bail!("no link {link} in {ns_name}")
        };
        for a in l.attributes {
            if let LinkAttribute::Stats64(s) = a {
                return Ok(s.tx_bytes);
            }
        }
        bail!("link {link} in {ns_name} reports no statistics")
    }

    // ---- fault injectors (TESTBED.md's table) ----

    /// NIC flap, host side: the host's `rail<r>` admin down or up.
    pub async fn set_host_nic(&mut self, host: usize, rail: usize, up: bool) -> anyhow::Result<()> {
        let ns = self.hosts[host].name.clone();
        let h = self.handle(&ns)?;
        set_up(&h, &format!("rail{rail}"), up).await
    }

    /// Link/cable flap, fabric side: the host sees carrier loss.
    pub async fn set_fabric_link(
        &mut self,
        host: usize,
        rail: usize,
        up: bool,
    ) -> anyhow::Result<()> {
        let fab = self.fab.name.clone();
        let h = self.handle(&fab)?;
        set_up(&h, &format!("h{host}r{rail}"), up).await
    }

    /// [`Self::set_fabric_link`], timed: returns when the request was handed
    /// to netlink and when the kernel acknowledged it (Unix ns; the link
    /// changed between the two). The link is looked up before the first
    /// stamp, so the lookup's round trip is not in the window.
    pub async fn set_fabric_link_timed(
        &mut self,
        host: usize,
        rail: usize,
        up: bool,
    ) -> anyhow::Result<(u64, u64)> {
        let fab = self.fab.name.clone();
        let h = self.handle(&fab)?;
        let name = format!("h{host}r{rail}");
        let idx = link_index(&h, &name).await?;
        let sent = unix_ns();
        set_index_up(&h, idx, &name, up).await?;
        Ok((sent, unix_ns()))
    }

    /// A silent dead path: the fabric end of the host's `rail<r>` cable
    /// detached from (or reattached to) its rail bridge. Both ends stay up
    /// with carrier, so netlink sees nothing; traffic vanishes.
    pub async fn set_blackhole(
        &mut self,
        host: usize,
        rail: usize,
        on: bool,
    ) -> anyhow::Result<()> {
        let fab = self.fab.name.clone();
        let h = self.handle(&fab)?;
        let name = format!("h{host}r{rail}");
        let idx = link_index(&h, &name).await?;
        let b = LinkUnspec::new_with_index(idx);
        let msg = if on {
            b.nocontroller().build()
        } else {
            let br = link_index(&h, &self.rail_bridge(host, rail)).await?;
            b.controller(br).build()
        };
        h.link()
            .set(msg)
            .execute()
            .await
            .with_context(|| format!("{} {name}", if on { "detach" } else { "reattach" }))
    }

    /// A gray link: the fabric end of the host's `rail<r>` cable drops
    /// `pct` % of the packets it sends to the host, each chosen at random,
    /// while both ends stay up with carrier (netlink sees nothing; see
    /// [`crate::drops`]). `pct` 0 removes it.
    pub async fn set_gray_loss(
        &mut self,
        host: usize,
        rail: usize,
        pct: f64,
    ) -> anyhow::Result<()> {
        let dev = format!("h{host}r{rail}");
        crate::drops::clear(&self.fab.name, &dev).await;
        if pct == 0.0 {
            return Ok(());
        }
        crate::drops::random(&self.fab.name, &dev, pct).await
    }

    /// A gray link that delays: the fabric end of the host's `rail<r>`
    /// cable holds back what it sends to the host for random moments, as
    /// `spec` says, without dropping anything, both ends up with carrier
    /// ([`crate::stalls`]). Until [`crate::stalls::Stalls::stop`].
    pub async fn gray_stalls(
        &self,
        host: usize,
        rail: usize,
        spec: crate::stalls::StallSpec,
    ) -> anyhow::Result<crate::stalls::Stalls> {
        let dev = format!("h{host}r{rail}");
        crate::stalls::Stalls::start(&self.fab, &dev, spec).await
    }

    /// Cuts between nodes on the management network: for each `(a, b)`,
    /// `a` no longer hears `b` (the fabric end of `a`'s `mgmt0` drops what
    /// comes from `b`'s address); `b` may still hear `a`, so a cut one way
    /// is an asymmetric partition. Replaces every earlier cut; an empty
    /// list heals them all. The links stay up.
    pub async fn set_mgmt_cuts(&mut self, cuts: &[(Node, Node)]) -> anyhow::Result<()> {
        let port = |n: Node| match n {
            Node::Supervisor(i) => format!("s{i}m"),
            Node::Host(i) => format!("h{i}m"),
        };
        let all = (0..self.spec.supervisors)
            .map(Node::Supervisor)
            .chain((0..self.spec.hosts).map(Node::Host));
        for n in all {
            crate::drops::clear(&self.fab.name, &port(n)).await;
        }
        let mut by_port: BTreeMap<String, Vec<std::net::Ipv4Addr>> = BTreeMap::new();
        for (a, b) in cuts {
            by_port
                .entry(port(*a))
                .or_default()
                .push(crate::plan::mgmt_addr(*b));
        }
        for (dev, from) in by_port {
            crate::drops::from_sources(&self.fab.name, &dev, &from).await?;
        }
        Ok(())
    }

    /// Management partition: the node's `mgmt0` fabric end down or up.
    pub async fn set_mgmt(&mut self, node: Node, up: bool) -> anyhow::Result<()> {
        let fab = self.fab.name.clone();
        let h = self.handle(&fab)?;
        let name = match node {
            Node::Supervisor(i) => format!("s{i}m"),
            Node::Host(i) => format!("h{i}m"),
        };
        set_up(&h, &name, up).await
    }

    /// A NIC flap on either side of the cable.
    pub async fn set_cable(
        &mut self,
        host: usize,
        rail: usize,
        side: Side,
        up: bool,
    ) -> anyhow::Result<()> {
        match side {
            Side::Host => self.set_host_nic(host, rail, up).await,
            Side::Fabric => self.set_fabric_link(host, rail, up).await,
        }
    }

    /// A flapping storm: `count` down/up cycles of one cable.
    pub async fn flap_storm(&mut self, p: &FlapPattern) -> anyhow::Result<()> {
        for _ in 0..p.count.min(10_000) {
            self.set_cable(p.host, p.rail, p.side, false).await?;
            tokio::time::sleep(p.down).await;
            self.set_cable(p.host, p.rail, p.side, true).await?;
            let j = if p.jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_micros(rand::random::<u64>() % (p.jitter.as_micros() as u64).max(1))
            };
            tokio::time::sleep(p.gap + j).await;
        }
        Ok(())
    }

    /// Host loss: kill every process in the host (the agent and the ranks
    /// it launched) and set all its cables down (fabric side).
    pub async fn lose_host(&mut self, host: usize) -> anyhow::Result<()> {
        self.kill_node(Node::Host(host));
        self.kill_namespace_processes(Node::Host(host));
        self.set_mgmt(Node::Host(host), false).await?;
        for r in 0..2 {
            self.set_fabric_link(host, r, false).await?;
        }
        Ok(())
    }

    // ---- processes ----

    /// A `Command` for `program` inside `node` (spawn it with [`Self::spawn_command`]).
    pub fn command(&self, node: Node, program: &str) -> anyhow::Result<Command> {
        Ok(self.ns(node).command(program)?)
    }

    /// Spawns a prepared command and tracks it: it is killed when the
    /// testbed is torn down (or by [`Self::kill_node`]).
    pub fn spawn_command(&self, node: Node, mut cmd: Command) -> anyhow::Result<u32> {
        let child = cmd.spawn().context("spawn in namespace")?;
        let pid = child.id();
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((node, child));
        self.register();
        Ok(pid)
    }

    /// Sends `signal` to every process started in `node` (SIGSTOP /
    /// SIGCONT: a paused supervisor); how many.
    pub fn signal_node(&self, node: Node, signal: i32) -> usize {
        let ch = self.children.lock().unwrap_or_else(|e| e.into_inner());
        ch.iter()
            .filter(|(n, _)| *n == node)
            // SAFETY: signalling a child process we spawned and still own.
            .filter(|(_, c)| unsafe { libc::kill(c.id() as i32, signal) == 0 })
            .count()
    }

    /// SIGKILLs every process started in `node` (supervisor crash, host loss).
    pub fn kill_node(&self, node: Node) {
        let mut ch = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for (_, c) in ch.iter_mut().filter(|(n, _)| *n == node) {
            let _ = c.kill();
            let _ = c.wait();
        }
        ch.retain(|(n, _)| *n != node);
    }

    /// SIGKILLs every process whose network namespace is `node`'s,
    /// including ones this process did not start directly (ranks an agent
    /// launched). Returns how many. Only our own namespaces are scanned
    /// for, so nothing outside the testbed is touched.
    pub fn kill_namespace_processes(&self, node: Node) -> usize {
        use std::os::unix::fs::MetadataExt;
        let Ok(target) = std::fs::metadata(&self.ns(node).path) else {
            return 0;
        };
        let me = std::process::id();
        let mut killed = 0;
        // Bounded: a few rounds, for children forked while we scan.
        for _ in 0..5 {
            let mut found = 0;
            let Ok(dir) = std::fs::read_dir("/proc") else {
                return killed;
            };
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                if pid as u32 == me {
                    continue;
                }
                let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) else {
                    continue;
                };
                if m.ino() == target.ino() && m.dev() == target.dev() {
                    // SAFETY: kill has no memory preconditions; the pid was
                    // just seen inside our namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    found += 1;
                }
            }
            killed += found;
            if found == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        killed
    }

    /// Kills all processes and removes all namespaces. Idempotent.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let mut ch = std::mem::take(&mut *self.children.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, c) in ch.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for h in 0..self.spec.hosts {
            self.kill_namespace_processes(Node::Host(h));
        }
        self.handles.clear();
        for n in self.namespace_names() {
            if let Err(e) = netns::delete(&n) {
                eprintln!("testbed: cannot delete namespace {n}: {e}");
            }
        }
        let _ = std::fs::remove_file(format!("{OWNER_DIR}/{}.owner", self.prefix));
        forget_testbed(&self.fab.name);
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn radix36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = vec![b'0'; 5];
    for i in (0..5).rev() {
        s[i] = digits[(n % 36) as usize];
        n /= 36;
    }
    String::from_utf8(s).expect("ascii")
}
