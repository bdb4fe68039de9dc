//! The job sockets themselves: accepting them (at most
//! [`MAX_PENDING_HELLOS`] waiting for `hello`), one task per socket reading
//! bounded lines ([`HELLO_TIMEOUT`], [`LINE_TIMEOUT`]), admitting `hello`
//! by the peer's credentials, and the sweep of connections whose job went
//! away. What each message does is `Control::handle`.

use super::*;

impl Control {
    /// Serves job sockets until the task is dropped; sweeps orphaned
    /// connections every second.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        let sweeper = {
            let c = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    c.sweep(Instant::now());
                }
            })
        };
        let _stop_sweeper = AbortOnDrop(sweeper);
        let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HELLOS));
        let mut turned_away = 0u64;
        loop {
            match listener.accept().await {
                Ok((s, _)) => match pending.clone().try_acquire_owned() {
                    Ok(permit) => {
                        tokio::spawn(self.clone().session(s, permit));
                    }
                    Err(_) => {
                        // Closed by the drop: a flood of silent connections
                        // never stops a rank from saying hello for long.
                        turned_away += 1;
                        if turned_away.is_power_of_two() {
                            tracing::warn!(turned_away, max = MAX_PENDING_HELLOS, "job socket: too many connections waiting to say hello; closing new ones");
                        }
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Reports closed the connections of sockets gone for [`ORPHAN_GRACE`].
    pub fn sweep(&self, now: Instant) {
        let mut inv = self.lock();
        let expired: Vec<ConnKey> = inv
            .conns
            .iter()
            .filter(|(_, r)| {
                r.orphaned_at
                    .is_some_and(|t| now.duration_since(t) >= ORPHAN_GRACE)
            })
            .map(|(k, _)| k.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        tracing::info!(
            conns = expired.len(),
            "connections of jobs that did not reconnect are closed"
        );
        for k in expired {
            if let Some(r) = inv.conns.remove(&k) {
                inv.bury(k, r.conn);
            }
        }
        drop(inv);
        self.changed.notify_one();
    }

    /// Whether `peer` may say `hello`: the rank events' rule (the
    /// launcher's); without them (a control plane running no jobs) only
    /// root and the agent's own user may.
    fn admit(&self, hello: &Hello, peer: Option<Peer>) -> Result<(), String> {
        let Some(peer) = peer else {
            return Err("the agent cannot tell which process is connected (no SO_PEERCRED); closing the connection".into());
        };
        match &self.ranks {
            Some(r) => r.admit(hello, &peer),
            // SAFETY: geteuid cannot fail.
            None if peer.uid == 0 || peer.uid == unsafe { libc::geteuid() } => Ok(()),
            None => Err(format!(
                "uid {} may not speak for job {} on this agent",
                peer.uid, hello.job
            )),
        }
    }

    /// One job socket. `pending` is held until the connection has said
    /// `hello` (or is closed): it must do so within [`HELLO_TIMEOUT`], with
    /// its first line (anything else is answered once, then the socket is
    /// closed), and every line it begins must end within [`LINE_TIMEOUT`].
    async fn session(
        self: Arc<Self>,
        stream: UnixStream,
        pending: tokio::sync::OwnedSemaphorePermit,
    ) {
        let mut pending = Some(pending);
        let peer = match stream.peer_cred() {
            Ok(c) => c
                .pid()
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 0)
                .map(|pid| Peer { pid, uid: c.uid() }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a job socket's peer credentials");
                None
            }
        };
        let (rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<AgentMessage>(SESSION_QUEUE);
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if let Err(e) = contract::write_message(&mut wr, &m).await {
                    tracing::debug!(error = %e, "job socket write failed");
                    return;
                }
            }
        });
        let mut reader = LineReader::new(rd).with_line_timeout(self.line_timeout);
        let mut sid: Option<u64> = None;
        let mut greeted = false;
        let hello_by = tokio::time::Instant::now() + self.hello_timeout;
        loop {
            if sid.is_some() {
                pending = None;
            }
            let next = match pending {
                Some(_) => match tokio::time::timeout_at(hello_by, reader.next_line()).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::warn!(peer = ?peer, "job socket said no hello in time; closing it");
                        let _ = tx
                            .send(AgentMessage::Error {
                                message: format!(
                                    "no hello within {} ms; closing the connection",
                                    self.hello_timeout.as_millis()
                                ),
                            })
                            .await;
                        break;
                    }
                },
                None => reader.next_line().await,
            };
            let msg = match next {
                Ok(Some(line)) => contract::decode_job(line),
                Ok(None) => break,
                Err(
                    e @ (ContractError::LineTooLong { .. } | ContractError::LineTimeout { .. }),
                ) => {
                    tracing::warn!(session = ?sid, error = %e, "job sent an oversized or unfinished line; closing its socket");
                    let _ = tx
                        .send(AgentMessage::Error {
                            message: format!("{e}; closing the connection"),
                        })
                        .await;
                    break;
                }
                Err(e) => {
                    tracing::debug!(session = ?sid, error = %e, "job socket read failed");
                    break;
                }
            };
            let msg = msg.and_then(|m| m.validate().map(|()| m));
            // A hello is admitted (or refused) before it changes anything.
            let refusal = match &msg {
                Ok(JobMessage::Hello(h)) if sid.is_none() => {
                    self.admit(h, peer).err().inspect(|e| {
                        tracing::warn!(job = %h.job, rank = h.rank, claimed_pid = h.pid, peer = ?peer, error = %e, "hello refused; closing the job socket");
                    })
                }
                _ => None,
            };
            let refused = refusal.is_some();
            let (reply, then) = match (msg, refusal) {
                (Err(e), _) => (Err(e.to_string()), Vec::new()),
                (Ok(_), Some(e)) => (Err(e), Vec::new()),
                (Ok(m), None) => match self.handle(&mut sid, &tx, m) {
                    Ok(then) => (Ok(()), then),
                    Err(e) => (Err(e), Vec::new()),
                },
            };
            let out = match reply {
                Ok(()) => AgentMessage::Ok,
                Err(message) => {
                    tracing::debug!(session = ?sid, error = %message, "job message refused");
                    AgentMessage::Error { message }
                }
            };
            let greeting = matches!(out, AgentMessage::Ok) && sid.is_some() && !greeted;
            let mut closed = tx.send(out).await.is_err();
            if greeting {
                // The held-out set between the answer and the orders.
                greeted = true;
                if let Some(id) = sid {
                    self.greet(id);
                }
            }
            for m in then {
                closed |= tx.send(m).await.is_err();
            }
            // Before a hello is accepted one answer is all a connection
            // gets: a peer cannot keep a pending slot by sending lines
            // that are not a hello (nor fill its queue with our answers).
            if closed || refused || sid.is_none() {
                break;
            }
        }
        drop(pending);
        if let Some(id) = sid {
            self.end_session(id);
        }
        drop(tx);
        // A peer that stopped reading cannot hold the task: what it has not
        // taken within the bound is dropped with the socket.
        let abort = writer.abort_handle();
        if tokio::time::timeout(self.line_timeout, writer)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}
