//! The application's side of a resilient connection: [`ResilientConnection`]
//! (open, send, receive, flush) and the cloneable [`ConnSender`] and
//! [`ConnControl`] handles. They talk to the connection's task (the
//! driver) over bounded channels only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::soft::Endpoint;

use super::config::ConnConfig;
use super::driver::{Driver, Order};
use super::error::ConnError;
use super::report::{ConnStats, Delivery};

/// Sends on a connection; clones share the connection's order.
#[derive(Clone)]
pub struct ConnSender {
    data: mpsc::Sender<Bytes>,
    failure: Arc<Mutex<Option<ConnError>>>,
    max_message: usize,
}

impl ConnSender {
    /// Queues one message; waits while the send window is full.
    pub async fn send(&self, msg: Bytes) -> Result<(), ConnError> {
        if msg.len() > self.max_message {
            return Err(ConnError::TooLarge {
                len: msg.len(),
                max: self.max_message,
            });
        }
        self.data
            .send(msg)
            .await
            .map_err(|_| failure_of(&self.failure))
    }
}

/// The transport a job uses between two ranks.
pub struct ResilientConnection {
    data: mpsc::Sender<Bytes>,
    orders: mpsc::Sender<Order>,
    deliveries: mpsc::Receiver<Delivery>,
    stats: watch::Receiver<ConnStats>,
    failure: Arc<Mutex<Option<ConnError>>>,
    max_message: usize,
    task: JoinHandle<()>,
    endpoint: Arc<Endpoint>,
    conn_id: u64,
}

impl ResilientConnection {
    /// Opens the connection on `endpoint`; the peer opens the same `conn_id`
    /// with the other side. Returns at once: the first path is set up in
    /// the background, and sends queue (bounded) until it exists.
    pub fn open(endpoint: Arc<Endpoint>, cfg: ConnConfig) -> Result<Self, ConnError> {
        cfg.validate(&endpoint)?;
        let incoming = endpoint
            .register(cfg.conn_id)
            .map_err(|e| ConnError::Endpoint(e.to_string()))?;
        let (data_tx, data_rx) = mpsc::channel(16);
        let (order_tx, order_rx) = mpsc::channel(16);
        let (deliver_tx, deliver_rx) = mpsc::channel(cfg.recv_queue);
        let (stats_tx, stats_rx) = watch::channel(ConnStats::default());
        let failure = Arc::new(Mutex::new(None));
        let driver = Driver::new(
            endpoint.clone(),
            cfg.clone(),
            deliver_tx,
            stats_tx,
            failure.clone(),
        );
        let task = tokio::spawn(driver.run(data_rx, order_rx, incoming));
        Ok(Self {
            data: data_tx,
            orders: order_tx,
            deliveries: deliver_rx,
            stats: stats_rx,
            failure,
            max_message: cfg.max_message,
            task,
            endpoint,
            conn_id: cfg.conn_id,
        })
    }

    fn failed(&self) -> ConnError {
        failure_of(&self.failure)
    }

    /// Queues one message; waits while the send window is full.
    pub async fn send(&self, msg: Bytes) -> Result<(), ConnError> {
        self.sender().send(msg).await
    }

    /// A handle that sends on this connection (for a task of its own).
    pub fn sender(&self) -> ConnSender {
        ConnSender {
            data: self.data.clone(),
            failure: self.failure.clone(),
            max_message: self.max_message,
        }
    }

    /// The next message, in order.
    pub async fn recv(&mut self) -> Result<Bytes, ConnError> {
        self.recv_delivery().await.map(|d| d.payload)
    }

    /// The next message with the path that carried it.
    pub async fn recv_delivery(&mut self) -> Result<Delivery, ConnError> {
        match self.deliveries.recv().await {
            Some(d) => Ok(d),
            None => Err(self.failed()),
        }
    }

    /// Orders a migration (see [`ConnControl::migrate`]).
    pub async fn migrate(&self, rail: Option<usize>) -> Result<(), ConnError> {
        self.control().migrate(rail).await
    }

    /// Limits the connection's rate (see [`ConnControl::set_rate`]).
    pub async fn set_rate(&self, bytes_per_s: Option<u64>) -> Result<(), ConnError> {
        self.control().set_rate(bytes_per_s).await
    }

    /// A handle that orders migrations and pacing (for the task that
    /// answers the agent's orders).
    pub fn control(&self) -> ConnControl {
        ConnControl {
            orders: self.orders.clone(),
            failure: self.failure.clone(),
            stats: self.stats.clone(),
        }
    }

    /// Current figures.
    pub fn stats(&self) -> ConnStats {
        self.stats.borrow().clone()
    }

    /// Follows the figures (changes on every path change).
    pub fn watch_stats(&self) -> watch::Receiver<ConnStats> {
        self.stats.clone()
    }

    /// Waits until every message sent so far is acknowledged by the peer;
    /// `false` if that did not happen within `timeout`.
    pub async fn flush(&self, timeout: Duration) -> Result<bool, ConnError> {
        let mut st = self.stats.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.task.is_finished() {
                return Err(self.failed());
            }
            let queued = self.data.capacity() < self.data.max_capacity();
            let done = {
                let s = st.borrow_and_update();
                !queued && s.acked_through == s.sent
            };
            if done {
                return Ok(true);
            }
            // Queued sends do not change the stats until they reach the
            // window: poll briefly while any are queued.
            let wait = if queued {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(100)
            };
            let until = deadline.min(tokio::time::Instant::now() + wait);
            let _ = tokio::time::timeout_at(until, st.changed()).await;
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }
}

impl Drop for ResilientConnection {
    fn drop(&mut self) {
        self.task.abort();
        self.endpoint.unregister(self.conn_id);
    }
}

/// Why a connection stopped: its recorded error, or `Closed`.
fn failure_of(failure: &Mutex<Option<ConnError>>) -> ConnError {
    failure
        .lock()
        .expect("failure lock poisoned")
        .clone()
        .unwrap_or(ConnError::Closed)
}

/// Orders for a connection from another task. Cheap to clone; calls fail
/// with the connection's error once it has failed or closed.
#[derive(Clone)]
pub struct ConnControl {
    orders: mpsc::Sender<Order>,
    failure: Arc<Mutex<Option<ConnError>>>,
    stats: watch::Receiver<ConnStats>,
}

impl ConnControl {
    fn failed(&self) -> ConnError {
        failure_of(&self.failure)
    }

    /// Orders a migration to `rail`, or off the current rail to the best
    /// other one (`None`). A migration to the rail the connection is on
    /// already does nothing (an agent's order may cross the connection's
    /// own reflex).
    pub async fn migrate(&self, rail: Option<usize>) -> Result<(), ConnError> {
        self.orders
            .send(Order::Migrate(rail))
            .await
            .map_err(|_| self.failed())
    }

    /// Limits the connection to `bytes_per_s` on the wire (`None`: no limit).
    pub async fn set_rate(&self, bytes_per_s: Option<u64>) -> Result<(), ConnError> {
        self.orders
            .send(Order::Rate(bytes_per_s))
            .await
            .map_err(|_| self.failed())
    }

    /// Follows the connection's figures (changes on every path change).
    pub fn watch_stats(&self) -> watch::Receiver<ConnStats> {
        self.stats.clone()
    }

    /// Resolves once the connection has failed or closed, with why (for a
    /// task blocked elsewhere that must not miss this connection's end).
    pub async fn closed(&self) -> ConnError {
        let mut st = self.stats.clone();
        while st.changed().await.is_ok() {}
        self.failed()
    }
}
