//! A session's frames read by their own task, so that the reading end can wait for them in a
//! `select!` with other work. `read_sealed` is not cancel-safe: when `select!` drops it for
//! another branch in the middle of a frame (a large launch arriving in pieces while a
//! heartbeat is due), the bytes already taken off the socket are lost, the next read starts
//! inside a frame, and the session fails authentication.

use super::{read_sealed, Opener};
use crate::frame::ProtocolError;
use serde::de::DeserializeOwned;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

/// The frames of one session's receiving half; the task reading them ends when this is dropped.
pub struct SealedReader<T> {
    frames: mpsc::UnboundedReceiver<Result<Option<T>, ProtocolError>>,
    task: tokio::task::JoinHandle<()>,
}

impl<T: DeserializeOwned + Send + 'static> SealedReader<T> {
    pub fn spawn<R: AsyncRead + Unpin + Send + 'static>(mut rd: R, mut opener: Opener) -> Self {
        let (tx, frames) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let msg = read_sealed::<_, T>(&mut rd, &mut opener).await;
                crate::probe::mark("sealed frame read");
                let last = !matches!(msg, Ok(Some(_)));
                if tx.send(msg).is_err() || last {
                    return;
                }
            }
        });
        SealedReader { frames, task }
    }

    /// The next frame; `Ok(None)` at the end of the connection. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<T>, ProtocolError> {
        self.frames.recv().await.unwrap_or(Ok(None))
    }
}

impl<T> Drop for SealedReader<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ControllerMessage;
    use crate::auth::{session, ClusterKey, Role, KEY_BYTES};
    use berth_core::JobId;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_frame_arriving_in_pieces_survives_a_select_with_a_fast_ticker() {
        let key = ClusterKey::from_bytes([7; KEY_BYTES]);
        let (mut sealer, _) = session(&key, &[1; 16], &[2; 16], Role::Controller);
        let (_, opener) = session(&key, &[1; 16], &[2; 16], Role::Agent);
        let (a, b) = tokio::io::duplex(1 << 20);
        // A frame too large to come in one piece: a long reason.
        let big = ControllerMessage::Kill { id: JobId(9), reason: "x".repeat(200_000) };
        let mut bytes = Vec::new();
        crate::frame::write_frame(&mut bytes, &sealer.seal(&big).unwrap()).await.unwrap();
        crate::frame::write_frame(&mut bytes, &sealer.seal(&ControllerMessage::EndAck { id: JobId(10) }).unwrap())
            .await
            .unwrap();
        let writer = tokio::spawn(async move {
            let mut a = a;
            for piece in bytes.chunks(50_000) {
                a.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            a
        });
        let mut reader = SealedReader::<ControllerMessage>::spawn(b, opener);
        let mut ticker = tokio::time::interval(Duration::from_millis(2));
        let (mut got, mut ticks) = (Vec::new(), 0);
        while got.len() < 2 {
            tokio::select! {
                m = reader.next() => got.push(m.expect("every frame opens").expect("two frames, then the end")),
                _ = ticker.tick() => ticks += 1,
            }
        }
        assert!(ticks > 10, "the ticker won the race many times mid-frame ({ticks})");
        assert!(matches!(&got[0], ControllerMessage::Kill { id: JobId(9), reason } if reason.len() == 200_000));
        assert!(matches!(got[1], ControllerMessage::EndAck { id: JobId(10) }));
        drop(writer.await.unwrap());
        assert!(reader.next().await.unwrap().is_none(), "the end of the connection");
    }
}
