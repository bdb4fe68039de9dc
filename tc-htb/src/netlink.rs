//! The two netlink exchanges everything else is built from: one request
//! that must be acknowledged, and one dump, both bounded in time (and the
//! dump in size).

use futures::StreamExt;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::tc::TcMessage;
use netlink_packet_route::RouteNetlinkMessage;
use tracing::debug;

use crate::error::ShapeError;
use crate::model::REQUEST_TIMEOUT;

/// Messages accepted from one dump (bounded memory).
const MAX_DUMP_MESSAGES: usize = 16_384;

/// Sends `body` with `NLM_F_REQUEST | NLM_F_ACK | flags` and waits for the
/// kernel's acknowledgement (an error reply becomes [`ShapeError::Kernel`]).
pub(crate) async fn send_ack(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    op: String,
    body: RouteNetlinkMessage,
    flags: u16,
) -> Result<(), ShapeError> {
    let mut req = NetlinkMessage::from(body);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut h = handle.clone();
    let mut resp = h.request(req).map_err(|e| ShapeError::Protocol {
        op: op.clone(),
        ifindex,
        detail: e.to_string(),
    })?;
    let wait = async {
        while let Some(msg) = resp.next().await {
            if let NetlinkPayload::Error(e) = msg.payload {
                if e.code.is_some() {
                    return Err(e.to_io());
                }
            }
        }
        Ok(())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, wait).await {
        Err(_) => Err(ShapeError::Timeout { op, ifindex }),
        Ok(Err(source)) => Err(ShapeError::Kernel {
            op,
            ifindex,
            source,
        }),
        Ok(Ok(())) => {
            debug!(ifindex, %op, "tc request acknowledged");
            Ok(())
        }
    }
}

/// Dumps the qdiscs, classes or filters `body` asks for, keeping only those
/// of `ifindex`; at most `MAX_DUMP_MESSAGES` messages.
pub(crate) async fn dump(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    op: &str,
    body: RouteNetlinkMessage,
) -> Result<Vec<TcMessage>, ShapeError> {
    let mut req = NetlinkMessage::from(body);
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut h = handle.clone();
    let proto = |detail: String| ShapeError::Protocol {
        op: op.to_string(),
        ifindex,
        detail,
    };
    let mut resp = h.request(req).map_err(|e| proto(e.to_string()))?;
    let collect = async {
        let mut out = Vec::new();
        while let Some(msg) = resp.next().await {
            match msg.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewQueueDiscipline(m)
                    | RouteNetlinkMessage::NewTrafficClass(m)
                    | RouteNetlinkMessage::NewTrafficFilter(m),
                ) => {
                    if m.header.index == ifindex as i32 {
                        out.push(m);
                    }
                    if out.len() > MAX_DUMP_MESSAGES {
                        return Err(Err(format!("more than {MAX_DUMP_MESSAGES} messages")));
                    }
                }
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(Ok(e.to_io())),
                _ => {}
            }
        }
        Ok(out)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, collect).await {
        Err(_) => Err(ShapeError::Timeout {
            op: op.to_string(),
            ifindex,
        }),
        Ok(Err(Ok(source))) => Err(ShapeError::Kernel {
            op: op.to_string(),
            ifindex,
            source,
        }),
        Ok(Err(Err(detail))) => Err(proto(detail)),
        Ok(Ok(v)) => Ok(v),
    }
}
