//! The fabric's topology: which links a path between two host NICs crosses
//! (DESIGN.md flow 4: intersecting contended paths over the topology
//! localises the bottleneck).
//!
//! A topology file names switches, the links between them and where each
//! host NIC attaches:
//!
//! ```toml
//! [[switches]]
//! name = "rail0-leaf0"
//!
//! [[switches]]
//! name = "rail0-leaf1"
//!
//! [[links]]
//! name = "rail0-uplink"
//! a = "rail0-leaf0"
//! b = "rail0-leaf1"
//! rate = "400Mbit"        # optional: what reshaping may hand out
//!
//! [[attach]]
//! host = "h0"
//! nic = "rail0"
//! switch = "rail0-leaf0"
//! ```
//!
//! Every NIC's cable is a link too, named `HOST:NIC` (its own rate, if the
//! file gives one on the `attach`). Links are full duplex: each has two
//! directions, and queueing is tracked per direction ([`DirLink`]).
//!
//! The switch graph must be a forest (a tree per fabric): routes are then
//! unique. ECMP fabrics are not modelled; a loop is a load error naming it.
//! Loading validates everything and a bad file changes nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Largest topology file read (bytes).
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// Most switches, inter-switch links and attachments in one topology.
pub const MAX_SWITCHES: usize = 4096;
pub const MAX_LINKS: usize = 16384;
pub const MAX_ATTACHMENTS: usize = 65536;

/// A topology file as written (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    #[serde(default)]
    pub switches: Vec<SwitchDef>,
    #[serde(default)]
    pub links: Vec<LinkDef>,
    #[serde(default)]
    pub attach: Vec<AttachDef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchDef {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkDef {
    pub name: String,
    pub a: String,
    pub b: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachDef {
    pub host: String,
    pub nic: String,
    pub switch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
}

/// Why a topology was refused; each names the offending entry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    /// The file cannot be read.
    #[error("cannot read topology file {path}: {error}")]
    Read { path: String, error: String },
    /// The file exceeds the size limit.
    #[error("topology file {path} is {bytes} bytes; the limit is {MAX_FILE_BYTES}")]
    TooLarge { path: String, bytes: u64 },
    /// The file is not valid TOML for the topology format.
    #[error("topology file is not valid TOML: {0}")]
    Syntax(String),
    /// A switch, link or host name is empty, too long or has other characters.
    #[error("{what} {name:?} is not a valid name (1–64 of A-Z a-z 0-9 . _ -)")]
    BadName { what: &'static str, name: String },
    /// A name is defined twice.
    #[error("{what} {name:?} is defined twice")]
    Duplicate { what: &'static str, name: String },
    /// A link or NIC names a switch that is not defined.
    #[error("{what} {name:?} names switch {switch:?}, which is not defined")]
    UnknownSwitch {
        what: &'static str,
        name: String,
        switch: String,
    },
    /// A link joins a switch to itself.
    #[error("link {name:?} joins switch {switch:?} to itself")]
    SelfLoop { name: String, switch: String },
    /// A link closes a loop: the switch graph must be a forest.
    #[error("link {name:?} closes a loop between {a:?} and {b:?}: routes must be unique (a tree per fabric; ECMP is not modelled)")]
    Loop { name: String, a: String, b: String },
    /// A rate that does not parse or is zero.
    #[error("{what} {name:?}: bad rate {rate:?}: {error}")]
    BadRate {
        what: &'static str,
        name: String,
        rate: String,
        error: String,
    },
    /// More switches, links or NICs than the limit.
    #[error("too many {what}: {count} (the limit is {limit})")]
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
}

/// One direction of a link: `from` → `to` (switch names, or `HOST:NIC`
/// for a NIC's cable end).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DirLink {
    pub link: String,
    pub from: String,
    pub to: String,
}

impl fmt::Display for DirLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}→{})", self.link, self.from, self.to)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub name: String,
    pub a: String,
    pub b: String,
    pub rate_bps: Option<u64>,
    /// A NIC's cable (`HOST:NIC`) rather than a link between switches
    /// (`cable.is_some()`, kept for the API's readers).
    pub access: bool,
    /// A NIC's cable: that host and NIC; `None` for a link between
    /// switches.
    #[serde(default)]
    pub cable: Option<(String, String)>,
}

/// A validated topology.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    switches: BTreeSet<String>,
    /// Inter-switch links by name.
    links: BTreeMap<String, Link>,
    /// Switch → (neighbour switch, link name).
    adjacency: BTreeMap<String, Vec<(String, String)>>,
    /// (host, nic) → (switch, cable rate).
    attach: BTreeMap<(String, String), (String, Option<u64>)>,
    /// The file it came from, re-serialised (for display).
    source: TopologyFile,
}

fn check_name(what: &'static str, s: &str) -> Result<(), TopologyError> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(TopologyError::BadName {
            what,
            name: s.to_owned(),
        })
    }
}

fn rate(what: &'static str, name: &str, r: &Option<String>) -> Result<Option<u64>, TopologyError> {
    r.as_deref()
        .map(|s| {
            playbooks::parse_rate(s).map_err(|error| TopologyError::BadRate {
                what,
                name: name.to_owned(),
                rate: s.to_owned(),
                error,
            })
        })
        .transpose()
}

fn limit(what: &'static str, count: usize, limit: usize) -> Result<(), TopologyError> {
    if count > limit {
        return Err(TopologyError::TooMany { what, count, limit });
    }
    Ok(())
}

impl Topology {
    /// Reads and validates a topology file.
    pub fn load(path: &Path) -> Result<Topology, TopologyError> {
        let read_err = |e: std::io::Error| TopologyError::Read {
            path: path.display().to_string(),
            error: e.to_string(),
        };
        let bytes = std::fs::metadata(path).map_err(read_err)?.len();
        if bytes > MAX_FILE_BYTES {
            return Err(TopologyError::TooLarge {
                path: path.display().to_string(),
                bytes,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Topology::parse(&text)
    }

    /// Parses and validates topology TOML.
    pub fn parse(text: &str) -> Result<Topology, TopologyError> {
        let file: TopologyFile =
            toml::from_str(text).map_err(|e| TopologyError::Syntax(e.to_string()))?;
        Topology::build(file)
    }

    /// Validates a topology.
    pub fn build(file: TopologyFile) -> Result<Topology, TopologyError> {
        limit("switches", file.switches.len(), MAX_SWITCHES)?;
        limit("links", file.links.len(), MAX_LINKS)?;
        limit("attachments", file.attach.len(), MAX_ATTACHMENTS)?;
        let mut t = Topology::default();
        for s in &file.switches {
            check_name("switch", &s.name)?;
            if !t.switches.insert(s.name.clone()) {
                return Err(TopologyError::Duplicate {
                    what: "switch",
                    name: s.name.clone(),
                });
            }
            t.adjacency.insert(s.name.clone(), Vec::new());
        }
        // Union-find over switches: a link joining two switches already
        // connected closes a loop.
        let index: BTreeMap<&str, usize> = t
            .switches
            .iter()
            .enumerate()
            .map(|(i, s)| (s.as_str(), i))
            .collect();
        let mut parent: Vec<usize> = (0..index.len()).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        for l in &file.links {
            check_name("link", &l.name)?;
            if t.links.contains_key(&l.name) {
                return Err(TopologyError::Duplicate {
                    what: "link",
                    name: l.name.clone(),
                });
            }
            for end in [&l.a, &l.b] {
                if !t.switches.contains(end) {
                    return Err(TopologyError::UnknownSwitch {
                        what: "link",
                        name: l.name.clone(),
                        switch: end.clone(),
                    });
                }
            }
            if l.a == l.b {
                return Err(TopologyError::SelfLoop {
                    name: l.name.clone(),
                    switch: l.a.clone(),
                });
            }
            let (ra, rb) = (root(&mut parent, index[l.a.as_str()]), {
                root(&mut parent, index[l.b.as_str()])
            });
            if ra == rb {
                return Err(TopologyError::Loop {
                    name: l.name.clone(),
                    a: l.a.clone(),
                    b: l.b.clone(),
                });
            }
            parent[ra] = rb;
            let rate_bps = rate("link", &l.name, &l.rate)?;
            t.adjacency
                .get_mut(&l.a)
                .expect("checked")
                .push((l.b.clone(), l.name.clone()));
            t.adjacency
                .get_mut(&l.b)
                .expect("checked")
                .push((l.a.clone(), l.name.clone()));
            t.links.insert(
                l.name.clone(),
                Link {
                    name: l.name.clone(),
                    a: l.a.clone(),
                    b: l.b.clone(),
                    rate_bps,
                    access: false,
                    cable: None,
                },
            );
        }
        for a in &file.attach {
            check_name("host", &a.host)?;
            check_name("NIC", &a.nic)?;
            let name = format!("{}:{}", a.host, a.nic);
            if !t.switches.contains(&a.switch) {
                return Err(TopologyError::UnknownSwitch {
                    what: "attachment",
                    name,
                    switch: a.switch.clone(),
                });
            }
            if t.links.contains_key(&name) {
                return Err(TopologyError::Duplicate { what: "link", name });
            }
            let rate_bps = rate("attachment", &name, &a.rate)?;
            let key = (a.host.clone(), a.nic.clone());
            if t.attach.contains_key(&key) {
                return Err(TopologyError::Duplicate {
                    what: "attachment",
                    name,
                });
            }
            t.attach.insert(key, (a.switch.clone(), rate_bps));
        }
        t.source = file;
        Ok(t)
    }

    /// The file this topology came from.
    pub fn file(&self) -> &TopologyFile {
        &self.source
    }

    pub fn is_empty(&self) -> bool {
        self.attach.is_empty()
    }

    /// Every link: inter-switch links, then every NIC's cable.
    pub fn links(&self) -> Vec<Link> {
        let mut out: Vec<Link> = self.links.values().cloned().collect();
        for ((host, nic), (switch, rate_bps)) in &self.attach {
            out.push(Link {
                name: format!("{host}:{nic}"),
                a: format!("{host}:{nic}"),
                b: switch.clone(),
                rate_bps: *rate_bps,
                access: true,
                cable: Some((host.clone(), nic.clone())),
            });
        }
        out
    }

    /// A link by name (inter-switch or `HOST:NIC`).
    pub fn link(&self, name: &str) -> Option<Link> {
        if let Some(l) = self.links.get(name) {
            return Some(l.clone());
        }
        let (host, nic) = name.split_once(':')?;
        let (switch, rate_bps) = self.attach.get(&(host.to_owned(), nic.to_owned()))?;
        Some(Link {
            name: name.to_owned(),
            a: name.to_owned(),
            b: switch.clone(),
            rate_bps: *rate_bps,
            access: true,
            cable: Some((host.to_owned(), nic.to_owned())),
        })
    }

    /// The switch a host NIC attaches to.
    pub fn switch_of(&self, host: &str, nic: &str) -> Option<&str> {
        self.attach
            .get(&(host.to_owned(), nic.to_owned()))
            .map(|(s, _)| s.as_str())
    }

    /// The directed links a packet from `src`'s NIC to `dst`'s NIC crosses,
    /// in order: the source cable, the switch links, the destination cable.
    /// None when either NIC is not in the topology or the two are in
    /// different fabrics.
    pub fn route(
        &self,
        src_host: &str,
        src_nic: &str,
        dst_host: &str,
        dst_nic: &str,
    ) -> Option<Vec<DirLink>> {
        let from = self.switch_of(src_host, src_nic)?;
        let to = self.switch_of(dst_host, dst_nic)?;
        let src_end = format!("{src_host}:{src_nic}");
        let dst_end = format!("{dst_host}:{dst_nic}");
        let mut out = vec![DirLink {
            link: src_end.clone(),
            from: src_end,
            to: from.to_owned(),
        }];
        out.extend(self.switch_route(from, to)?);
        out.push(DirLink {
            link: dst_end.clone(),
            from: to.to_owned(),
            to: dst_end,
        });
        Some(out)
    }

    /// Breadth-first search over the switch forest (routes are unique).
    fn switch_route(&self, from: &str, to: &str) -> Option<Vec<DirLink>> {
        if from == to {
            return Some(Vec::new());
        }
        let mut prev: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
        let mut queue = VecDeque::from([from]);
        let mut seen = BTreeSet::from([from]);
        while let Some(s) = queue.pop_front() {
            if s == to {
                break;
            }
            for (n, link) in self.adjacency.get(s).into_iter().flatten() {
                if seen.insert(n.as_str()) {
                    prev.insert(n.as_str(), (s, link.as_str()));
                    queue.push_back(n.as_str());
                }
            }
        }
        let mut hops = Vec::new();
        let mut at = to;
        while at != from {
            let (p, link) = prev.get(at)?;
            hops.push(DirLink {
                link: (*link).to_owned(),
                from: (*p).to_owned(),
                to: at.to_owned(),
            });
            at = p;
        }
        hops.reverse();
        Some(hops)
    }

    /// The host NICs attached to switches reachable from `switch` without
    /// crossing `link`: the side of `link` that `switch` is on.
    pub fn side(&self, link: &str, switch: &str) -> BTreeSet<(String, String)> {
        let mut seen = BTreeSet::from([switch.to_owned()]);
        let mut queue = VecDeque::from([switch.to_owned()]);
        while let Some(s) = queue.pop_front() {
            for (n, l) in self.adjacency.get(&s).into_iter().flatten() {
                if l != link && seen.insert(n.clone()) {
                    queue.push_back(n.clone());
                }
            }
        }
        self.attach
            .iter()
            .filter(|(_, (s, _))| seen.contains(s))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_LEAVES: &str = r#"
[[switches]]
name = "leaf0"
[[switches]]
name = "leaf1"
[[switches]]
name = "r1"
[[links]]
name = "uplink"
a = "leaf0"
b = "leaf1"
rate = "400Mbit"
[[attach]]
host = "h0"
nic = "rail0"
switch = "leaf0"
[[attach]]
host = "h1"
nic = "rail0"
switch = "leaf0"
[[attach]]
host = "h2"
nic = "rail0"
switch = "leaf1"
rate = "10Gbit"
[[attach]]
host = "h0"
nic = "rail1"
switch = "r1"
"#;

    fn dl(link: &str, from: &str, to: &str) -> DirLink {
        DirLink {
            link: link.into(),
            from: from.into(),
            to: to.into(),
        }
    }

    #[test]
    fn routes_cross_cables_and_switch_links_in_order() {
        let t = Topology::parse(TWO_LEAVES).unwrap();
        assert_eq!(
            t.route("h0", "rail0", "h2", "rail0").unwrap(),
            vec![
                dl("h0:rail0", "h0:rail0", "leaf0"),
                dl("uplink", "leaf0", "leaf1"),
                dl("h2:rail0", "leaf1", "h2:rail0"),
            ]
        );
        assert_eq!(
            t.route("h2", "rail0", "h1", "rail0").unwrap()[1],
            dl("uplink", "leaf1", "leaf0"),
            "the reverse path crosses the other direction"
        );
        assert_eq!(t.route("h0", "rail0", "h1", "rail0").unwrap().len(), 2);
        assert_eq!(t.route("h0", "rail1", "h2", "rail0"), None, "two fabrics");
        assert_eq!(t.route("h9", "rail0", "h2", "rail0"), None);
        assert_eq!(t.link("uplink").unwrap().rate_bps, Some(400_000_000));
        assert_eq!(t.link("h2:rail0").unwrap().rate_bps, Some(10_000_000_000));
        assert!(t.link("h2:rail0").unwrap().access);
        assert_eq!(t.links().len(), 5);
        let left = t.side("uplink", "leaf0");
        assert_eq!(
            left,
            BTreeSet::from([("h0".into(), "rail0".into()), ("h1".into(), "rail0".into())])
        );
    }

    #[test]
    fn a_written_file_loads_back_the_same() {
        let t = Topology::parse(TWO_LEAVES).unwrap();
        let text = toml::to_string(t.file()).unwrap();
        assert_eq!(Topology::parse(&text).unwrap(), t);
    }

    #[test]
    fn bad_files_are_refused_naming_the_entry() {
        let cases: &[(&str, &str)] = &[
            ("[[switches]]\nname = \"a b\"\n", "not a valid name"),
            (
                "[[switches]]\nname = \"a\"\n[[switches]]\nname = \"a\"\n",
                "defined twice",
            ),
            (
                "[[switches]]\nname = \"a\"\n[[links]]\nname = \"l\"\na = \"a\"\nb = \"zz\"\n",
                "\"zz\", which is not defined",
            ),
            (
                "[[switches]]\nname = \"a\"\n[[links]]\nname = \"l\"\na = \"a\"\nb = \"a\"\n",
                "to itself",
            ),
            (
                "[[switches]]\nname = \"a\"\n[[switches]]\nname = \"b\"\n\
                 [[links]]\nname = \"l1\"\na = \"a\"\nb = \"b\"\n\
                 [[links]]\nname = \"l2\"\na = \"b\"\nb = \"a\"\n",
                "closes a loop",
            ),
            (
                "[[switches]]\nname = \"a\"\n[[switches]]\nname = \"b\"\n\
                 [[links]]\nname = \"l1\"\na = \"a\"\nb = \"b\"\nrate = \"fast\"\n",
                "bad rate",
            ),
            (
                "[[switches]]\nname = \"a\"\n[[attach]]\nhost = \"h\"\nnic = \"n\"\nswitch = \"a\"\n\
                 [[attach]]\nhost = \"h\"\nnic = \"n\"\nswitch = \"a\"\n",
                "attachment \"h:n\" is defined twice",
            ),
            (
                "[[attach]]\nhost = \"h\"\nnic = \"n\"\nswitch = \"nope\"\n",
                "not defined",
            ),
            ("[[switch]]\nname = \"a\"\n", "unknown field"),
            ("switches = 3", "not valid TOML"),
        ];
        for (text, want) in cases {
            let e = Topology::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e:?} lacks {want:?}");
        }
    }

    #[test]
    fn load_refuses_missing_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let e = Topology::load(&dir.path().join("nope.toml")).unwrap_err();
        assert!(matches!(e, TopologyError::Read { .. }), "{e}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
        assert!(matches!(
            Topology::load(&big).unwrap_err(),
            TopologyError::TooLarge { .. }
        ));
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, TWO_LEAVES).unwrap();
        assert!(!Topology::load(&ok).unwrap().is_empty());
    }
}
