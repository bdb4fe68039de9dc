//! The contract's framing: one JSON object per bounded line, decoded by its
//! `type` tag into [`JobMessage`] or [`AgentMessage`].

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use super::error::ContractError;
use super::messages::{AgentMessage, JobMessage, AGENT_MESSAGE_TYPES, JOB_MESSAGE_TYPES, MAX_LINE};

/// Encodes one message as a line (with its newline).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ContractError> {
    let mut v = serde_json::to_vec(msg).map_err(|e| ContractError::Malformed(e.to_string()))?;
    if v.len() > MAX_LINE {
        return Err(ContractError::LineTooLong { max: MAX_LINE });
    }
    v.push(b'\n');
    Ok(v)
}

fn decode_tagged<T: DeserializeOwned>(
    line: &[u8],
    known: &'static [&'static str],
) -> Result<T, ContractError> {
    if line.len() > MAX_LINE {
        return Err(ContractError::LineTooLong { max: MAX_LINE });
    }
    let v: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| ContractError::Malformed(format!("not JSON: {e}")))?;
    let Some(obj) = v.as_object() else {
        return Err(ContractError::Malformed("not a JSON object".into()));
    };
    let tag = match obj.get("type") {
        None => return Err(ContractError::Malformed("no \"type\" field".into())),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => return Err(ContractError::Malformed("\"type\" is not a string".into())),
    };
    if !known.contains(&tag.as_str()) {
        return Err(ContractError::UnknownType {
            found: tag,
            expected: known,
        });
    }
    serde_json::from_value(v).map_err(|e| ContractError::Malformed(format!("{tag}: {e}")))
}

/// Decodes a job's line (without its newline).
pub fn decode_job(line: &[u8]) -> Result<JobMessage, ContractError> {
    decode_tagged(line, JOB_MESSAGE_TYPES)
}

/// Decodes an agent's line (without its newline) and checks it.
pub fn decode_agent(line: &[u8]) -> Result<AgentMessage, ContractError> {
    let m: AgentMessage = decode_tagged(line, AGENT_MESSAGE_TYPES)?;
    m.validate()?;
    Ok(m)
}

/// Reads bounded lines from a stream.
pub struct LineReader<R> {
    inner: BufReader<R>,
    buf: Vec<u8>,
    /// How long a begun line may take to finish (none: no limit).
    line_timeout: Option<std::time::Duration>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(r: R) -> Self {
        Self {
            inner: BufReader::new(r),
            buf: Vec::new(),
            line_timeout: None,
        }
    }

    /// Once a line's first bytes have arrived, the rest must arrive within
    /// `t` ([`ContractError::LineTimeout`] otherwise): a peer cannot hold a
    /// half-written line open forever. Waiting between lines is not
    /// limited.
    pub fn with_line_timeout(mut self, t: std::time::Duration) -> Self {
        self.line_timeout = Some(t);
        self
    }

    /// The next line without its newline (`\r\n` accepted); `None` at a clean
    /// end of stream. After [`ContractError::LineTooLong`] or
    /// [`ContractError::LineTimeout`] the stream is out of step: close it.
    pub async fn next_line(&mut self) -> Result<Option<&[u8]>, ContractError> {
        self.buf.clear();
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let chunk = match deadline {
                None => self.inner.fill_buf().await?,
                Some(d) => match tokio::time::timeout_at(d, self.inner.fill_buf()).await {
                    Ok(r) => r?,
                    Err(_) => {
                        let ms = self.line_timeout.map_or(0, |t| t.as_millis() as u64);
                        return Err(ContractError::LineTimeout { ms });
                    }
                },
            };
            if chunk.is_empty() {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ContractError::Malformed(
                    "connection closed in the middle of a line".into(),
                ));
            }
            let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if self.buf.len() + take > MAX_LINE {
                return Err(ContractError::LineTooLong { max: MAX_LINE });
            }
            self.buf.extend_from_slice(&chunk[..take]);
            self.inner.consume(if done { take + 1 } else { take });
            if deadline.is_none() && !done && !self.buf.is_empty() {
                deadline = self.line_timeout.map(|t| tokio::time::Instant::now() + t);
            }
            if done {
                if self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
                return Ok(Some(&self.buf));
            }
        }
    }
}

/// Writes one message line.
pub async fn write_message<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), ContractError> {
    let line = encode(msg)?;
    w.write_all(&line).await?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use tokio::io::AsyncWriteExt;

    use crate::contract::error::ContractError;
    use crate::contract::messages::*;
    use crate::contract::wire::*;

    /// Connection `id` of job `j` rank 0 on `nic`, to h1 rank 1 on rail 0
    /// (also the client's tests' fixture).
    pub(crate) fn conn(id: u64, nic: &str) -> ConnUp {
        ConnUp {
            job: "j".into(),
            rank: 0,
            conn_id: id,
            nic: nic.into(),
            peer_host: "h1".into(),
            peer_rank: 1,
            rail: 0,
        }
    }

    #[test]
    fn every_message_roundtrips_with_a_type_tag() {
        let msgs = vec![
            JobMessage::Hello(Hello {
                job: "j".into(),
                rank: 3,
                pid: 42,
            }),
            JobMessage::ConnUp(conn(u64::MAX, "rail0")),
            JobMessage::ConnMoved {
                conn_id: 7,
                nic: "rail1".into(),
            },
            JobMessage::ConnClosed { conn_id: 7 },
            JobMessage::OrderDone(OrderAnswer {
                order_id: 9,
                ok: false,
                detail: "d".into(),
                step: None,
            }),
            JobMessage::OrderDone(OrderAnswer {
                order_id: 10,
                ok: true,
                detail: String::new(),
                step: Some(40),
            }),
        ];
        for m in msgs {
            let line = encode(&m).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
            assert!(v["type"].is_string(), "{v}");
            assert_eq!(decode_job(&line[..line.len() - 1]).unwrap(), m);
        }
        let orders = vec![
            AgentMessage::Ok,
            AgentMessage::Error {
                message: "no".into(),
            },
            AgentMessage::Order(Order {
                order_id: 1,
                kind: OrderKind::Migrate {
                    conn_ids: vec![1, 2],
                    to_nic: Some("rail1".into()),
                },
            }),
            AgentMessage::Order(Order {
                order_id: 2,
                kind: OrderKind::Pace {
                    conn_id: 1,
                    bytes_per_s: None,
                },
            }),
            AgentMessage::Order(Order {
                order_id: 3,
                kind: OrderKind::Checkpoint {
                    step: Some(100),
                    halt: false,
                },
            }),
            AgentMessage::Order(Order {
                order_id: 4,
                kind: OrderKind::Stop,
            }),
            AgentMessage::HeldOut {
                nics: vec!["rail0".into()],
            },
            AgentMessage::HeldOut { nics: vec![] },
        ];
        for m in orders {
            let line = encode(&m).unwrap();
            assert_eq!(decode_agent(&line[..line.len() - 1]).unwrap(), m);
        }
        // The documented shape, written by hand (another language's job).
        let m = decode_job(br#"{"type":"conn_moved","conn_id":7,"nic":"rail1"}"#).unwrap();
        assert_eq!(
            m,
            JobMessage::ConnMoved {
                conn_id: 7,
                nic: "rail1".into()
            }
        );
        let o = decode_agent(
            br#"{"type":"order","order_id":5,"kind":{"type":"migrate","conn_ids":[7]}}"#,
        )
        .unwrap();
        assert!(matches!(
            o,
            AgentMessage::Order(Order {
                kind: OrderKind::Migrate { to_nic: None, .. },
                ..
            })
        ));
    }

    #[test]
    fn a_held_out_set_is_bounded_and_names_are_checked() {
        let e = decode_agent(br#"{"type":"held_out","nics":["rail 0"]}"#).unwrap_err();
        assert!(e.to_string().contains("whitespace"), "{e}");
        let many: Vec<String> = (0..=MAX_HELD_OUT_NICS).map(|i| format!("n{i}")).collect();
        let line = serde_json::json!({"type": "held_out", "nics": many}).to_string();
        let e = decode_agent(line.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        let e = decode_agent(br#"{"type":"held_out"}"#).unwrap_err();
        assert!(e.to_string().contains("nics"), "{e}");
    }

    #[test]
    fn garbage_unknown_types_and_bad_fields_get_clear_errors() {
        let e = decode_job(b"hello there").unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
        let e = decode_job(b"[1,2]").unwrap_err();
        assert!(e.to_string().contains("not a JSON object"), "{e}");
        let e = decode_job(br#"{"job":"j"}"#).unwrap_err();
        assert!(e.to_string().contains("no \"type\""), "{e}");
        let e = decode_job(br#"{"type":"conn_teleported","conn_id":1}"#).unwrap_err();
        assert!(matches!(e, ContractError::UnknownType { .. }), "{e}");
        assert!(e.to_string().contains("conn_teleported"), "{e}");
        assert!(e.to_string().contains("conn_moved"), "lists the known: {e}");
        let e = decode_job(br#"{"type":"conn_moved","conn_id":"x","nic":"a"}"#).unwrap_err();
        assert!(
            e.to_string().starts_with("malformed message: conn_moved"),
            "{e}"
        );
        let e = decode_job(br#"{"type":"conn_up","job":"j"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field"), "{e}");
        // Well-formed but invalid names.
        let m = JobMessage::ConnMoved {
            conn_id: 1,
            nic: "rail 0".into(),
        };
        assert!(m.validate().unwrap_err().to_string().contains("whitespace"));
        let m = JobMessage::Hello(Hello {
            job: String::new(),
            rank: 0,
            pid: 0,
        });
        assert!(m.validate().is_err());
        let m = JobMessage::OrderDone(OrderAnswer {
            order_id: 1,
            ok: true,
            detail: "x".repeat(MAX_DETAIL_LEN + 1),
            step: None,
        });
        assert!(m.validate().is_err());
        // A failure that names a checkpoint step contradicts itself.
        let m = JobMessage::OrderDone(OrderAnswer {
            order_id: 1,
            ok: false,
            detail: String::new(),
            step: Some(3),
        });
        assert!(m.validate().unwrap_err().to_string().contains("step 3"));
    }

    #[tokio::test]
    async fn a_begun_line_must_end_within_the_line_timeout() {
        let t = std::time::Duration::from_millis(100);
        let (mut a, b) = tokio::io::duplex(1 << 10);
        let mut r = LineReader::new(b).with_line_timeout(t);
        // Between lines the reader waits as long as it takes.
        tokio::time::sleep(t * 10).await;
        a.write_all(b"{\"type\":\"ok\"}\n{\"type\"").await.unwrap();
        assert!(r.next_line().await.unwrap().is_some());
        let t0 = tokio::time::Instant::now();
        let e = r.next_line().await.unwrap_err();
        assert!(matches!(e, ContractError::LineTimeout { ms: 100 }), "{e}");
        assert!(t0.elapsed() >= t);
    }

    #[tokio::test]
    async fn oversized_lines_are_refused_and_normal_ones_read() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut r = LineReader::new(b);
        a.write_all(b"{\"type\":\"ok\"}\r\n").await.unwrap();
        let mut big = vec![b'x'; MAX_LINE + 1];
        big.push(b'\n');
        a.write_all(&big).await.unwrap();
        let l = r.next_line().await.unwrap().unwrap().to_vec();
        assert_eq!(decode_agent(&l).unwrap(), AgentMessage::Ok);
        let e = r.next_line().await.unwrap_err();
        assert!(
            matches!(e, ContractError::LineTooLong { max: MAX_LINE }),
            "{e}"
        );
        assert!(e.to_string().contains("65536"), "{e}");
        // Exactly the limit is fine.
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut r = LineReader::new(b);
        let mut ok = vec![b'y'; MAX_LINE];
        ok.push(b'\n');
        a.write_all(&ok).await.unwrap();
        drop(a);
        assert_eq!(r.next_line().await.unwrap().unwrap().len(), MAX_LINE);
        assert!(r.next_line().await.unwrap().is_none(), "clean end");
        // Encoding refuses what the other side would refuse.
        let m = JobMessage::OrderDone(OrderAnswer {
            order_id: 1,
            ok: true,
            detail: "z".repeat(MAX_LINE),
            step: None,
        });
        assert!(matches!(encode(&m), Err(ContractError::LineTooLong { .. })));
        assert_eq!(truncate("aé", 2), "a");
    }
}
