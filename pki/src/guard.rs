//! [`until_revoked`]: the end of a long-lived stream whose peer lost its
//! right to it. A handshake checks revocation and validity once; a server
//! stream (an agent's orders, `events --follow`) may outlive both. The
//! guard ends the stream with `PermissionDenied` the moment the peer's
//! serial enters the revocation list (it waits on the list's change
//! notification, no polling) or its certificate expires, whichever comes
//! first. The caller's own items are passed through unchanged until then.

use std::pin::Pin;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use tonic::Status;

use crate::incoming::PeerInfo;
use crate::revocations::Revocations;

/// Why a guarded stream ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The peer's certificate was revoked while the stream was open.
    Revoked,
    /// The peer's certificate expired while the stream was open.
    Expired,
}

/// A boxed stream of tonic items, as server streaming handlers return.
pub type GuardedStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// How long until `at`, zero if it has passed.
fn until(at: SystemTime) -> Duration {
    at.duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

/// Resolves when `peer`'s certificate is revoked in `revocations` or
/// expires; says which.
pub async fn lost_right(revocations: &Revocations, peer: &PeerInfo) -> StreamEnd {
    tokio::select! {
        _ = revocations.revoked(&peer.serial) => StreamEnd::Revoked,
        _ = tokio::time::sleep(until(peer.not_after)) => StreamEnd::Expired,
    }
}

/// The refusal a guarded stream ends with.
pub fn end_status(peer: &PeerInfo, why: StreamEnd) -> Status {
    let what = match why {
        StreamEnd::Revoked => "was revoked",
        StreamEnd::Expired => "expired",
    };
    Status::permission_denied(format!(
        "certificate {} of {} {what}; the stream is closed",
        peer.serial, peer.identity
    ))
}

/// `stream`, ended with a `PermissionDenied` item (then nothing) as soon
/// as `peer`'s certificate is revoked or expires. Items already produced
/// are delivered in order; once the right is lost the inner stream is
/// dropped, which tells its producer the client went away.
pub fn until_revoked<T, S>(stream: S, revocations: Revocations, peer: PeerInfo) -> GuardedStream<T>
where
    T: Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + 'static,
{
    let lost = Box::pin(async move {
        let why = lost_right(&revocations, &peer).await;
        tracing::warn!(who = %peer.identity, serial = %peer.serial, ?why, "open stream closed: the certificate lost its right");
        end_status(&peer, why)
    });
    let state = Some((Box::pin(stream), lost));
    Box::pin(futures::stream::unfold(state, |state| async move {
        let (mut inner, mut lost) = state?;
        tokio::select! {
            // The refusal wins over an item ready at the same moment.
            biased;
            status = &mut lost => Some((Err(status), None)),
            item = inner.next() => item.map(|i| (i, Some((inner, lost)))),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Identity, Role};

    fn peer(serial: &str, valid_for: Duration) -> PeerInfo {
        PeerInfo {
            identity: Identity::admin("eve", Role::Viewer).unwrap(),
            serial: serial.parse().unwrap(),
            not_after: SystemTime::now() + valid_for,
            remote_addr: "127.0.0.1:1".parse().unwrap(),
        }
    }

    #[tokio::test]
    async fn a_revocation_ends_an_open_stream_and_others_go_on() {
        let revs = Revocations::new();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<u32, Status>>(4);
        let (tx2, rx2) = tokio::sync::mpsc::channel::<Result<u32, Status>>(4);
        let day = Duration::from_secs(86_400);
        let mut eve = until_revoked(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            revs.clone(),
            peer("0a", day),
        );
        let mut bob = until_revoked(
            tokio_stream::wrappers::ReceiverStream::new(rx2),
            revs.clone(),
            peer("0b", day),
        );
        tx.send(Ok(1)).await.unwrap();
        assert_eq!(eve.next().await.unwrap().unwrap(), 1);
        revs.revoke("0a".parse().unwrap());
        let e = tokio::time::timeout(Duration::from_secs(5), eve.next())
            .await
            .expect("ended at once")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("was revoked"), "{e}");
        assert!(eve.next().await.is_none(), "nothing after the refusal");
        // The inner stream was dropped: its producer sees the client gone.
        assert!(tx.send(Ok(2)).await.is_err());
        // Another serial's stream is untouched.
        tx2.send(Ok(7)).await.unwrap();
        assert_eq!(bob.next().await.unwrap().unwrap(), 7);
    }

    #[tokio::test]
    async fn an_expiry_ends_an_open_stream_and_a_finished_stream_just_ends() {
        let revs = Revocations::new();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<u32, Status>>(1);
        let mut s = until_revoked(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            revs.clone(),
            peer("0c", Duration::from_millis(50)),
        );
        let e = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("ended at expiry")
            .unwrap()
            .unwrap_err();
        assert!(e.message().contains("expired"), "{e}");
        let mut done = until_revoked(
            futures::stream::iter([Ok::<u32, Status>(3)]),
            revs,
            peer("0d", Duration::from_secs(60)),
        );
        assert_eq!(done.next().await.unwrap().unwrap(), 3);
        assert!(done.next().await.is_none());
    }

    #[tokio::test]
    async fn an_already_revoked_serial_ends_before_any_item() {
        let revs = Revocations::new();
        revs.revoke("0e".parse().unwrap());
        let mut s = until_revoked(
            futures::stream::iter([Ok::<u32, Status>(3)]),
            revs,
            peer("0e", Duration::from_secs(60)),
        );
        assert!(s.next().await.unwrap().is_err());
        assert!(s.next().await.is_none());
    }
}
