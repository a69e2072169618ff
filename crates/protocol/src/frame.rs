//! Length-prefixed JSON frames with a version check.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bumped on any incompatible change to a message (2: daemons authenticate with the cluster
/// key, docs/protocol.md "Authentication").
pub const PROTOCOL_VERSION: u32 = 2;

/// Larger frames are refused: no legitimate message comes near it, and it bounds what a
/// garbage peer can make us allocate.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "frame of {0} bytes is larger than the {MAX_FRAME_BYTES}-byte limit; is the peer speaking the berth protocol?"
    )]
    TooLarge(usize),
    #[error("malformed message: {0}; is the peer speaking the berth protocol?")]
    Malformed(String),
    #[error("authentication failed: {0}")]
    Auth(#[from] crate::auth::AuthError),
    #[error("peer speaks protocol version {theirs}, this program speaks {PROTOCOL_VERSION}; run the same berth version on both ends")]
    Version { theirs: u32 },
}

#[derive(Serialize)]
struct OutEnvelope<'a, T> {
    v: u32,
    #[serde(flatten)]
    body: &'a T,
}

/// How a message of this version begins as `to_json` writes it (`v` first).
const CURRENT_PREFIX: &str = "{\"v\":2,";

#[derive(Deserialize)]
struct VersionOnly {
    v: u32,
}

/// A message's frame body: its JSON with `"v"` (no length prefix).
pub fn to_json<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    serde_json::to_vec(&OutEnvelope { v: PROTOCOL_VERSION, body: msg })
        .map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// Encode a message as one frame's bytes (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let json = to_json(msg)?;
    if json.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge(json.len()));
    }
    let mut out = Vec::with_capacity(json.len() + 4);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Decode one frame's JSON body (without the length prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    // What `to_json` writes starts so: one parse, where checking the version first is a second
    // (every frame of a launch is decoded on its path; a sealed one twice, with its body).
    if body.starts_with(CURRENT_PREFIX.as_bytes()) {
        return serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(e.to_string()));
    }
    let version: VersionOnly =
        serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(format!("no protocol version: {e}")))?;
    if version.v != PROTOCOL_VERSION {
        return Err(ProtocolError::Version { theirs: version.v });
    }
    serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, msg: &T) -> Result<(), ProtocolError> {
    let bytes = encode(msg)?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(())
}

/// Read one message; `Ok(None)` on a clean end of stream before a frame starts.
pub async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R) -> Result<Option<T>, ProtocolError> {
    match read_raw_frame(r).await? {
        Some(body) => decode(&body).map(Some),
        None => Ok(None),
    }
}

/// Read one frame's body without decoding it; `Ok(None)` on a clean end of stream.
pub async fn read_raw_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, ProtocolError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ClientRequest, ClientResponse};
    use proptest::prelude::*;

    #[tokio::test]
    async fn roundtrip() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_frame(&mut a, &ClientRequest::Ping).await.unwrap();
        let got: ClientRequest = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(got, ClientRequest::Ping);
        drop(a);
        assert!(read_frame::<_, ClientRequest>(&mut b).await.unwrap().is_none());
    }

    #[test]
    fn the_version_is_checked_wherever_it_is() {
        assert_eq!(CURRENT_PREFIX, format!("{{\"v\":{PROTOCOL_VERSION},"), "the prefix follows the version");
        let written = to_json(&ClientRequest::Ping).unwrap();
        assert!(written.starts_with(CURRENT_PREFIX.as_bytes()), "{}", String::from_utf8_lossy(&written));
        assert_eq!(decode::<ClientRequest>(&written).unwrap(), ClientRequest::Ping);
        let later = br#"{"op":"ping","v":2}"#;
        assert_eq!(decode::<ClientRequest>(later).unwrap(), ClientRequest::Ping);
        for other in [&br#"{"v":3,"op":"ping"}"#[..], br#"{"op":"ping","v":1}"#] {
            assert!(matches!(decode::<ClientRequest>(other), Err(ProtocolError::Version { .. })));
        }
        assert!(matches!(decode::<ClientRequest>(br#"{"op":"ping"}"#), Err(ProtocolError::Malformed(_))));
        assert!(matches!(decode::<ClientRequest>(br#"{"v":2,"op":"nope"}"#), Err(ProtocolError::Malformed(_))));
    }

    #[tokio::test]
    async fn garbage_is_an_error_not_a_panic() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        // "GET " read as a length is > 1 GB.
        assert!(matches!(read_frame::<_, ClientRequest>(&mut b).await, Err(ProtocolError::TooLarge(_))));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&[0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o']).await.unwrap();
        assert!(matches!(read_frame::<_, ClientRequest>(&mut b).await, Err(ProtocolError::Malformed(_))));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let body = br#"{"v":99,"op":"ping"}"#;
        a.write_all(&(body.len() as u32).to_be_bytes()).await.unwrap();
        a.write_all(body).await.unwrap();
        assert!(matches!(read_frame::<_, ClientRequest>(&mut b).await, Err(ProtocolError::Version { theirs: 99 })));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<ClientRequest>(&bytes);
            let _ = decode::<ClientResponse>(&bytes);
            let _ = decode::<crate::agent::AgentMessage>(&bytes);
            let _ = decode::<crate::agent::ControllerMessage>(&bytes);
        }

        #[test]
        fn decoders_never_panic_on_json(s in "\\{\"v\":2,\"op\":\"[a-z_]{0,12}\"(,\"[a-z_]{1,8}\":(1|\"x\"|null|\\[\\]|\\{\\}))*\\}") {
            let _ = decode::<ClientRequest>(s.as_bytes());
            let _ = decode::<crate::agent::AgentMessage>(s.as_bytes());
        }
    }
}
