//! Real `ringtrain` processes on loopback: a ring of ranks on one host, one
//! data NIC each (`lo`, a 127.N.R.1 address per rank), with and without a
//! (fake) agent on the job contract's socket.
//!
//! What is checked: two runs give the same digest on every rank; a run
//! killed after a checkpoint and resumed from it gives the same digest; an
//! ordered halting checkpoint is written by every rank at one agreed step,
//! answered with that step, and stops the computation until a stop order (exit
//! 143), and resuming from it gives the same digest; a fragile rank whose
//! peer dies exits 75; bad configuration exits 2 with one line.
//!
//! In the netns testbed (needs root; fails instead of skipping when `CI`
//! is set), hosts with two rails: a cable cut under the ring moves its
//! connections and changes no bit of the result (the digest equals the
//! loopback run's); with `--fragile` the same cut ends the ranks with 75.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rdma::contract::{decode_job, encode, AgentMessage, JobMessage, Order, OrderAnswer, OrderKind};
use testbed::netns::Netns;
use testbed::{rail_addr, require_root, Node, Side, Testbed, TestbedSpec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_ringtrain");
/// Small enough for a debug build: ~30 ms per step with three ranks.
const MODEL: &[&str] = &["--hidden", "96", "--batch", "4", "--seed", "11"];
const STEPS: u64 = 30;

struct Ring {
    dir: PathBuf,
    net: u8,
    port: u16,
    world: u32,
    /// Testbed hosts, one per rank (rails `rail0`, `rail1`); empty: loopback.
    hosts: Vec<Netns>,
}

impl Ring {
    fn peers(&self) -> String {
        (0..self.world as usize)
            .map(|r| {
                if self.hosts.is_empty() {
                    format!("h{r}=127.{}.{r}.1", self.net)
                } else {
                    format!("h{r}={},{}", rail_addr(r, 0), rail_addr(r, 1))
                }
            })
            .collect::<Vec<_>>()
            .join(";")
    }

    fn nics(&self, r: u32) -> String {
        if self.hosts.is_empty() {
            format!("lo=127.{}.{r}.1", self.net)
        } else {
            let r = r as usize;
            format!("rail0={},rail1={}", rail_addr(r, 0), rail_addr(r, 1))
        }
    }

    fn command(&self, r: u32) -> Command {
        match self.hosts.get(r as usize) {
            Some(ns) => Command::from(ns.command(BIN).expect("command in namespace")),
            None => Command::new(BIN),
        }
    }

    fn log(&self, tag: &str, rank: u32) -> PathBuf {
        self.dir.join(format!("{tag}-rank-{rank}.log"))
    }

    /// Starts every rank; stdout and stderr go to `<tag>-rank-R.{log,err}`.
    fn spawn(
        &self,
        tag: &str,
        incarnation: u64,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Vec<Child> {
        (0..self.world)
            .map(|r| {
                let out = std::fs::File::create(self.log(tag, r)).expect("log");
                let err = std::fs::File::create(self.dir.join(format!("{tag}-rank-{r}.err")))
                    .expect("err log");
                let mut c = self.command(r);
                c.args(MODEL);
                if !extra.contains(&"--steps") {
                    c.args(["--steps", &STEPS.to_string()]);
                }
                c.args(extra)
                    .env_remove("RAILGUARD_AGENT_SOCKET")
                    .env("RAILGUARD_JOB", "rt")
                    .env("RAILGUARD_INCARNATION", incarnation.to_string())
                    .env("RAILGUARD_RANK", r.to_string())
                    .env("RAILGUARD_WORLD_SIZE", self.world.to_string())
                    .env("RAILGUARD_PEERS", self.peers())
                    .env("RAILGUARD_NICS", self.nics(r))
                    .env("RAILGUARD_PORT", self.port.to_string())
                    .env(
                        "RAILGUARD_CHECKPOINT_DIR",
                        self.dir.join(format!("ckpt-{tag}")),
                    )
                    .stdout(Stdio::from(out))
                    .stderr(Stdio::from(err))
                    .kill_on_drop(true);
                for (k, v) in env {
                    let v = v.replace("{rank}", &r.to_string());
                    c.env(k, v);
                }
                c.spawn().expect("spawn ringtrain")
            })
            .collect()
    }

    fn stdout(&self, tag: &str, rank: u32) -> String {
        std::fs::read_to_string(self.log(tag, rank)).unwrap_or_default()
    }

    fn stderr(&self, tag: &str, rank: u32) -> String {
        std::fs::read_to_string(self.dir.join(format!("{tag}-rank-{rank}.err"))).unwrap_or_default()
    }

    /// Waits for every rank (bounded) and returns the exit codes.
    async fn wait(&self, tag: &str, children: &mut [Child], within: Duration) -> Vec<i32> {
        let mut codes = Vec::new();
        for (r, c) in children.iter_mut().enumerate() {
            match tokio::time::timeout(within, c.wait()).await {
                Ok(Ok(s)) => codes.push(s.code().unwrap_or(-1)),
                _ => {
                    let _ = c.kill().await;
                    panic!(
                        "{tag} rank {r} did not exit within {within:?}\nstdout:\n{}\nstderr:\n{}",
                        self.stdout(tag, r as u32),
                        self.stderr(tag, r as u32)
                    );
                }
            }
        }
        codes
    }

    /// The digest every rank printed last (they must agree).
    fn digest(&self, tag: &str) -> String {
        let mut seen = None;
        for r in 0..self.world {
            let out = self.stdout(tag, r);
            let last = out.lines().last().unwrap_or_default().to_owned();
            let d = last
                .strip_prefix("digest=")
                .unwrap_or_else(|| panic!("{tag} rank {r}: last line {last:?}\n{out}"))
                .to_owned();
            assert_eq!(d.len(), 64, "{tag} rank {r}: {d}");
            if let Some(s) = &seen {
                assert_eq!(&d, s, "{tag}: rank {r} disagrees");
            }
            seen = Some(d);
        }
        seen.expect("a rank")
    }

    /// Waits until every rank's stdout has a line starting with `prefix`.
    /// Starts job `tag` fragile (1 s stall timeout, 1000 steps of
    /// `step_delay_ms` ms) and waits until every rank logged step 10.
    async fn fragile_at_step_10(&self, tag: &str, step_delay_ms: &str) -> Vec<Child> {
        let job = self.spawn(
            tag,
            1,
            &[
                "--fragile",
                "--stall-timeout",
                "1s",
                "--step-delay-ms",
                step_delay_ms,
                "--steps",
                "1000",
            ],
            &[],
        );
        self.wait_line(tag, "step=10", Duration::from_secs(60))
            .await;
        job
    }

    async fn wait_line(&self, tag: &str, prefix: &str, within: Duration) {
        let end = Instant::now() + within;
        loop {
            let all =
                (0..self.world).all(|r| self.stdout(tag, r).lines().any(|l| l.starts_with(prefix)));
            if all {
                return;
            }
            assert!(
                Instant::now() < end,
                "{tag}: no {prefix:?} line on every rank within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn ring(net: u8, port: u16, world: u32) -> (tempfile::TempDir, Ring) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    (
        tmp,
        Ring {
            dir,
            net,
            port,
            world,
            hosts: Vec::new(),
        },
    )
}

fn steps_logged(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("step="))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_digest_twice_and_after_a_kill_and_resume() {
    let (_tmp, ring) = ring(41, 27410, 3);
    let within = Duration::from_secs(60);
    let every = [("RAILGUARD_CHECKPOINT_EVERY", "10".to_string())];
    let mut a = ring.spawn("a", 1, &[], &every);
    assert_eq!(ring.wait("a", &mut a, within).await, vec![0, 0, 0]);
    let reference = ring.digest("a");
    for s in [10, 20, 30] {
        for r in 0..3 {
            assert!(ring
                .dir
                .join(format!("ckpt-a/step-{s}/rank-{r}.ckpt"))
                .exists());
        }
    }
    let mut b = ring.spawn("b", 2, &[], &[]);
    assert_eq!(ring.wait("b", &mut b, within).await, vec![0, 0, 0]);
    assert_eq!(ring.digest("b"), reference, "a second run differs");

    // Killed (SIGKILL) after the checkpoint at 20, resumed from it.
    let mut c = ring.spawn("c", 3, &["--step-delay-ms", "40"], &every);
    ring.wait_line("c", "checkpoint step=20", within).await;
    for ch in &mut c {
        ch.kill().await.expect("kill");
    }
    let killed_at: Vec<u64> = (0..3)
        .map(|r| {
            steps_logged(&ring.stdout("c", r))
                .last()
                .copied()
                .unwrap_or(0)
        })
        .collect();
    assert!(
        killed_at.iter().all(|s| *s < STEPS),
        "killed too late: {killed_at:?}"
    );
    let ckpt = ring.dir.join("ckpt-c").to_string_lossy().into_owned();
    let resume = [
        ("RAILGUARD_CHECKPOINT_DIR", ckpt),
        ("RAILGUARD_RESUME_STEP", "20".to_string()),
    ];
    let mut d = ring.spawn("d", 4, &[], &resume);
    assert_eq!(ring.wait("d", &mut d, within).await, vec![0, 0, 0]);
    for r in 0..3 {
        let out = ring.stdout("d", r);
        assert!(out.starts_with("resumed step=20\n"), "{out}");
        assert_eq!(steps_logged(&out), vec![30], "only steps 21..=30 computed");
    }
    assert_eq!(ring.digest("d"), reference, "resumed run differs");
}

/// One rank's agent: answers `ok` to every line, records them, pushes orders.
struct FakeAgent {
    got: mpsc::UnboundedReceiver<JobMessage>,
    push: mpsc::UnboundedSender<Order>,
    seen: Vec<JobMessage>,
}

impl FakeAgent {
    /// One agent per rank of `ring`, on `agent-<rank>.sock` in its dir, and
    /// the socket path template (`{rank}`) for `RAILGUARD_AGENT_SOCKET`.
    fn start_per_rank(ring: &Ring) -> (Vec<FakeAgent>, String) {
        let agents = (0..ring.world)
            .map(|r| FakeAgent::start(ring.dir.join(format!("agent-{r}.sock"))))
            .collect();
        let sock = ring.dir.join("agent-{rank}.sock");
        (agents, sock.to_string_lossy().into_owned())
    }

    fn start(socket: PathBuf) -> Self {
        let listener = UnixListener::bind(&socket).expect("bind agent socket");
        let (got_tx, got) = mpsc::unbounded_channel();
        let (push, mut orders) = mpsc::unbounded_channel::<Order>();
        tokio::spawn(async move {
            // One job connection at a time (the client reconnects if needed).
            while let Ok((stream, _)) = listener.accept().await {
                let (rd, mut wr) = stream.into_split();
                let mut lines = BufReader::new(rd).lines();
                loop {
                    tokio::select! {
                        l = lines.next_line() => {
                            let Ok(Some(l)) = l else { break };
                            let m = decode_job(l.as_bytes()).expect("a valid job line");
                            let _ = got_tx.send(m);
                            let ok = encode(&AgentMessage::Ok).expect("encode");
                            if wr.write_all(&ok).await.is_err() { break }
                        }
                        o = orders.recv() => {
                            let Some(o) = o else { return };
                            let line = encode(&AgentMessage::Order(o)).expect("encode");
                            if wr.write_all(&line).await.is_err() { break }
                        }
                    }
                }
            }
        });
        Self {
            got,
            push,
            seen: Vec::new(),
        }
    }

    /// Like [`Self::expect`] but gives up after `within` (None).
    async fn try_expect(
        &mut self,
        within: Duration,
        f: impl Fn(&JobMessage) -> bool,
    ) -> Option<JobMessage> {
        if let Some(m) = self.seen.iter().find(|m| f(m)) {
            return Some(m.clone());
        }
        let end = tokio::time::Instant::now() + within;
        while let Ok(Some(m)) = tokio::time::timeout_at(end, self.got.recv()).await {
            self.seen.push(m.clone());
            if f(&m) {
                return Some(m);
            }
        }
        None
    }

    /// Waits (bounded) for a message matching `f`, keeping all seen.
    async fn expect(&mut self, what: &str, f: impl Fn(&JobMessage) -> bool) -> JobMessage {
        if let Some(m) = self.seen.iter().find(|m| f(m)) {
            return m.clone();
        }
        let end = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout_at(end, self.got.recv()).await {
                Ok(Some(m)) => {
                    self.seen.push(m.clone());
                    if f(&m) {
                        return m;
                    }
                }
                _ => panic!("no {what} from the job; got {:?}", self.seen),
            }
        }
    }

    fn order(&self, order_id: u64, kind: OrderKind) {
        self.push
            .send(Order { order_id, kind })
            .expect("agent task");
    }
}

fn answer(m: &JobMessage) -> OrderAnswer {
    match m {
        JobMessage::OrderDone(a) => a.clone(),
        other => panic!("not an order_done: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_halting_checkpoint_is_agreed_halts_and_resumes_exactly() {
    let (_tmp, ring) = ring(42, 27420, 3);
    let within = Duration::from_secs(60);
    let mut reference = ring.spawn("ref", 1, &[], &[]);
    assert_eq!(
        ring.wait("ref", &mut reference, within).await,
        vec![0, 0, 0]
    );
    let reference = ring.digest("ref");

    let (mut agents, sock) = FakeAgent::start_per_rank(&ring);
    let mut job = ring.spawn(
        "job",
        2,
        &["--step-delay-ms", "40"],
        &[("RAILGUARD_AGENT_SOCKET", sock)],
    );
    for (r, a) in agents.iter_mut().enumerate() {
        let hello = a
            .expect("hello", |m| matches!(m, JobMessage::Hello(_)))
            .await;
        assert!(matches!(hello, JobMessage::Hello(h) if h.rank == r as u32 && h.job == "rt"));
        // Both ring connections, ids from the incarnation (2 << 32 | edge).
        for edge in [r as u64, ((r + 2) % 3) as u64] {
            let up = a
                .expect(
                    "conn_up",
                    |m| matches!(m, JobMessage::ConnUp(c) if c.conn_id == (2 << 32) | edge),
                )
                .await;
            let JobMessage::ConnUp(up) = up else {
                unreachable!()
            };
            assert_eq!(up.nic, "lo");
        }
    }
    ring.wait_line("job", "step=10", within).await;
    // Only rank 1 is asked; the others learn it from the all-reduce.
    agents[1].order(
        7,
        OrderKind::Checkpoint {
            step: None,
            halt: true,
        },
    );
    let done = agents[1]
        .expect(
            "order_done 7",
            |m| matches!(m, JobMessage::OrderDone(a) if a.order_id == 7),
        )
        .await;
    let OrderAnswer {
        ok, detail, step, ..
    } = answer(&done);
    assert!(ok, "{detail}");
    let n: u64 = step.expect("a checkpoint answer names its step");
    assert!((10..STEPS).contains(&n), "checkpoint at {n}");
    for a in agents.iter_mut() {
        a.expect("checkpointed", |m| {
            *m == JobMessage::Checkpointed { step: n }
        })
        .await;
    }
    ring.wait_line("job", &format!("halted step={n}"), within)
        .await;
    for r in 0..3 {
        assert!(ring
            .dir
            .join(format!("ckpt-job/step-{n}/rank-{r}.ckpt"))
            .exists());
    }
    // A late order at another rank is answered with the same step at once.
    agents[0].order(
        8,
        OrderKind::Checkpoint {
            step: None,
            halt: true,
        },
    );
    let late = answer(
        &agents[0]
            .expect(
                "order_done 8",
                |m| matches!(m, JobMessage::OrderDone(a) if a.order_id == 8),
            )
            .await,
    );
    assert!(late.ok && late.step == Some(n), "{late:?}");
    // Halted: nothing more is computed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for r in 0..3 {
        let logged = steps_logged(&ring.stdout("job", r));
        assert!(
            logged.iter().all(|s| *s <= n),
            "rank {r} computed past {n}: {logged:?}"
        );
        assert!(
            job[r as usize].try_wait().expect("try_wait").is_none(),
            "rank {r} exited while halted"
        );
    }
    for a in &agents {
        a.order(9, OrderKind::Stop);
    }
    assert_eq!(
        ring.wait("job", &mut job, within).await,
        vec![143, 143, 143]
    );
    for a in agents.iter_mut() {
        let OrderAnswer { ok, .. } = answer(
            &a.expect(
                "order_done 9",
                |m| matches!(m, JobMessage::OrderDone(a) if a.order_id == 9),
            )
            .await,
        );
        assert!(ok);
        a.expect("conn_closed", |m| {
            matches!(m, JobMessage::ConnClosed { .. })
        })
        .await;
    }
    for r in 0..3 {
        assert!(ring
            .stdout("job", r)
            .contains(&format!("stopped step={n} reason=order")));
    }
    // Resumed from the agreed step: the same weights as the reference run.
    let ckpt = ring.dir.join("ckpt-job").to_string_lossy().into_owned();
    let mut resumed = ring.spawn(
        "resumed",
        3,
        &[],
        &[
            ("RAILGUARD_CHECKPOINT_DIR", ckpt),
            ("RAILGUARD_RESUME_STEP", n.to_string()),
        ],
    );
    assert_eq!(
        ring.wait("resumed", &mut resumed, within).await,
        vec![0, 0, 0]
    );
    assert_eq!(ring.digest("resumed"), reference);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragile_rank_exits_75_when_its_peer_dies() {
    let (_tmp, ring) = ring(43, 27430, 2);
    let mut job = ring.fragile_at_step_10("f", "50").await;
    job[1].kill().await.expect("kill rank 1");
    let t0 = Instant::now();
    let code = tokio::time::timeout(Duration::from_secs(20), job[0].wait())
        .await
        .expect("rank 0 exits")
        .expect("wait");
    assert_eq!(code.code(), Some(75), "stderr: {}", ring.stderr("f", 0));
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    let err = ring.stderr("f", 0);
    assert!(err.contains("fatal network error"), "{err}");
}

/// Flags, environment, a word the error line must contain.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[tokio::test]
async fn bad_config_exits_2_with_one_line() {
    let cases: &[Case] = &[
        (&["--steps", "0"], &[], "--steps"),
        (&[], &[("RAILGUARD_RANK", "x")], "--rank"),
        (&[], &[("RAILGUARD_WORLD_SIZE", "2")], "peers"),
        (
            &[],
            &[
                ("RAILGUARD_WORLD_SIZE", "2"),
                ("RAILGUARD_PEERS", "a=1.2.3.4;b=nope"),
                ("RAILGUARD_NICS", "lo=1.2.3.4"),
                ("RAILGUARD_PORT", "1"),
            ],
            "not an IP address",
        ),
        (&["--resume-step", "3"], &[], "directory"),
    ];
    for (args, env, needle) in cases {
        let out = Command::new(BIN)
            .args(*args)
            .env_remove("RAILGUARD_AGENT_SOCKET")
            .envs(env.iter().copied())
            .output()
            .await
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("ringtrain: bad config:") && err.contains(needle),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[tokio::test]
async fn a_checkpoint_of_another_run_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let run = |extra: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["--hidden", "16", "--steps", "10", "--checkpoint-every", "5"])
            .arg("--checkpoint-dir")
            .arg(dir)
            .args(extra)
            .env_remove("RAILGUARD_AGENT_SOCKET");
        c
    };
    let out = run(&[]).output().await.expect("run");
    assert_eq!(out.status.code(), Some(0));
    let out = run(&["--resume-step", "5", "--seed", "2"])
        .output()
        .await
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("seed is 1, this run has 2"), "{err}");
    corrupt(&dir.join("step-5/rank-0.ckpt"));
    let out = run(&["--resume-step", "5"]).output().await.expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("corrupt"), "{err}");
}

fn corrupt(p: &Path) {
    let mut b = std::fs::read(p).expect("read");
    let i = b.len() / 3;
    b[i] ^= 1;
    std::fs::write(p, b).expect("write");
}

/// The loopback digest of [`MODEL`] × [`STEPS`] for `world` ranks.
async fn loopback_reference(net: u8, port: u16, world: u32) -> String {
    let (_tmp, ring) = ring(net, port, world);
    let mut c = ring.spawn("ref", 1, &[], &[]);
    assert_eq!(
        ring.wait("ref", &mut c, Duration::from_secs(60)).await,
        vec![0; world as usize]
    );
    ring.digest("ref")
}

async fn testbed_ring(world: u32) -> (Testbed, tempfile::TempDir, Ring) {
    let tb = Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: world as usize,
    })
    .await
    .expect("testbed");
    let (tmp, mut ring) = ring(0, 27450, world);
    ring.hosts = (0..world as usize)
        .map(|h| Netns::open(&tb.ns(Node::Host(h)).name).expect("open namespace"))
        .collect();
    (tb, tmp, ring)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netns_a_cable_cut_moves_the_ring_and_changes_no_bit() {
    if !require_root("ringtrain::netns_cable_cut").expect("root check") {
        return;
    }
    let reference = loopback_reference(44, 27440, 3).await;
    let (mut tb, _tmp, ring) = testbed_ring(3).await;
    let mut job = ring.spawn("cut", 1, &["--step-delay-ms", "40"], &[]);
    ring.wait_line("cut", "step=10", Duration::from_secs(60))
        .await;
    // Host 0's rail0 is the home of both its connections (edges 0 and 2).
    tb.set_cable(0, 0, Side::Host, false).await.expect("cut");
    tokio::time::sleep(Duration::from_millis(600)).await;
    tb.set_cable(0, 0, Side::Host, true).await.expect("restore");
    assert_eq!(
        ring.wait("cut", &mut job, Duration::from_secs(60)).await,
        vec![0, 0, 0]
    );
    assert_eq!(ring.digest("cut"), reference, "the cut changed the result");
    let err = ring.stderr("cut", 0);
    assert!(
        err.lines()
            .any(|l| l.contains("path up") && l.contains("rail=1")),
        "rank 0's connections never moved to rail1:\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netns_fragile_ranks_exit_75_when_their_rail_is_cut() {
    if !require_root("ringtrain::netns_fragile").expect("root check") {
        return;
    }
    let (mut tb, _tmp, ring) = testbed_ring(2).await;
    let mut job = ring.fragile_at_step_10("fragile", "40").await;
    tb.set_cable(0, 0, Side::Host, false).await.expect("cut");
    let t0 = Instant::now();
    let codes = ring
        .wait("fragile", &mut job, Duration::from_secs(20))
        .await;
    assert_eq!(codes, vec![75, 75], "rank 0: {}", ring.stderr("fragile", 0));
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netns_migrate_and_pace_orders_are_carried_out_and_reported() {
    if !require_root("ringtrain::netns_orders").expect("root check") {
        return;
    }
    let reference = loopback_reference(45, 27445, 2).await;
    let (_tb, _tmp, ring) = testbed_ring(2).await;
    let (mut agents, sock) = FakeAgent::start_per_rank(&ring);
    // Slow steps leave room for a repeated order (below) before the job
    // ends; a generous connect timeout keeps dials from failing under load.
    let mut job = ring.spawn(
        "orders",
        6,
        &["--step-delay-ms", "200", "--connect-timeout-ms", "2000"],
        &[("RAILGUARD_AGENT_SOCKET", sock)],
    );
    // Edge 0 (rank 0 → 1) has its home on rail0.
    let edge0 = 6 << 32;
    let up = agents[0]
        .expect(
            "conn_up",
            |m| matches!(m, JobMessage::ConnUp(c) if c.conn_id == edge0),
        )
        .await;
    assert!(
        matches!(up, JobMessage::ConnUp(c) if c.nic == "rail0" && c.rail == 0 && c.peer_rank == 1 && c.peer_host == "h1")
    );
    ring.wait_line("orders", "step=10", Duration::from_secs(60))
        .await;
    // The order holds (no automatic failback to the healthy rail0 while
    // pinned by it). Should a dial of rail1 fail under load, the connection
    // comes back on rail0 and the order is repeated (bounded), as an agent
    // would after seeing where it landed.
    let moved = |m: &JobMessage| {
        *m == JobMessage::ConnMoved {
            conn_id: edge0,
            nic: "rail1".into(),
        }
    };
    let mut landed = false;
    for id in 1..=4u64 {
        agents[0].order(
            id,
            OrderKind::Migrate {
                conn_ids: vec![edge0],
                to_nic: Some("rail1".into()),
            },
        );
        let OrderAnswer { ok, detail, .. } = answer(
            &agents[0]
                .expect(
                    "order_done",
                    |m| matches!(m, JobMessage::OrderDone(a) if a.order_id == id),
                )
                .await,
        );
        assert!(ok, "{detail}");
        if agents[0]
            .try_expect(Duration::from_secs(3), moved)
            .await
            .is_some()
        {
            landed = true;
            break;
        }
    }
    assert!(landed, "no conn_moved to rail1: {:?}", agents[0].seen);
    // The other end follows the move and reports it too.
    agents[1]
        .expect("peer's conn_moved", |m| {
            *m == JobMessage::ConnMoved {
                conn_id: edge0,
                nic: "rail1".into(),
            }
        })
        .await;
    agents[1].order(
        2,
        OrderKind::Pace {
            conn_id: (6 << 32) | 1,
            bytes_per_s: Some(200 << 20),
        },
    );
    let OrderAnswer { ok, detail, .. } = answer(
        &agents[1]
            .expect(
                "order_done 2",
                |m| matches!(m, JobMessage::OrderDone(a) if a.order_id == 2),
            )
            .await,
    );
    assert!(ok, "{detail}");
    // Unknown connections and NICs are refused by name.
    agents[1].order(
        3,
        OrderKind::Migrate {
            conn_ids: vec![99],
            to_nic: Some("rail9".into()),
        },
    );
    let OrderAnswer { ok, detail, .. } = answer(
        &agents[1]
            .expect(
                "order_done 3",
                |m| matches!(m, JobMessage::OrderDone(a) if a.order_id == 3),
            )
            .await,
    );
    assert!(!ok && detail.contains("rail9"), "{detail}");
    assert_eq!(
        ring.wait("orders", &mut job, Duration::from_secs(60)).await,
        vec![0, 0]
    );
    assert_eq!(ring.digest("orders"), reference);
    for a in agents.iter_mut() {
        a.expect("conn_closed", |m| {
            matches!(m, JobMessage::ConnClosed { .. })
        })
        .await;
    }
}

#[tokio::test]
async fn sigterm_stops_with_143() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out.log");
    let mut c = Command::new(BIN)
        .args([
            "--hidden",
            "16",
            "--steps",
            "100000",
            "--step-delay-ms",
            "5",
        ])
        .env_remove("RAILGUARD_AGENT_SOCKET")
        .stdout(Stdio::from(std::fs::File::create(&out).expect("log")))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let end = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("step=10 ")
    {
        assert!(Instant::now() < end, "no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = c.id().expect("pid") as i32;
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(10), c.wait())
        .await
        .expect("exits")
        .expect("wait");
    assert_eq!(status.code(), Some(143));
    let text = std::fs::read_to_string(&out).expect("log");
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.starts_with("stopped step=") && l.ends_with("reason=signal")),
        "{text}"
    );
}
