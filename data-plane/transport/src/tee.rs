//! A copy of a request body taken as it streams to its destination
//! ([`crate::body::RequestBody::with_tee`]), up to a size cap, handed over
//! whole once the body has ended. The body's reader is never held back: each
//! frame is copied (at most `cap` bytes in all) and passed on at once.

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

/// What the receiving side of a tee gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TeeError {
    /// The body grew past the cap: no copy.
    #[error("the body is larger than the copy's cap")]
    TooLarge,
}

/// The copying side, attached to a body.
#[derive(Debug)]
pub struct Tee {
    copy: BytesMut,
    cap: usize,
    done: Option<oneshot::Sender<Result<Bytes, TeeError>>>,
}

/// The copy, once the body has ended; the sender dropped (`Err` from the
/// channel) means the body was dropped or failed before its end.
pub type TeeReceiver = oneshot::Receiver<Result<Bytes, TeeError>>;

impl Tee {
    /// A tee copying at most `cap` bytes, and where the copy will arrive.
    pub fn new(cap: usize) -> (Self, TeeReceiver) {
        let (tx, rx) = oneshot::channel();
        let tee = Self {
            copy: BytesMut::new(),
            cap,
            done: Some(tx),
        };
        (tee, rx)
    }

    /// Copies one data frame. Returns false when the tee is spent (over the
    /// cap: the receiver was told) and can be dropped.
    pub fn data(&mut self, data: &Bytes) -> bool {
        if self.copy.len() + data.len() > self.cap {
            if let Some(tx) = self.done.take() {
                let _ = tx.send(Err(TeeError::TooLarge));
            }
            return false;
        }
        self.copy.extend_from_slice(data);
        true
    }

    /// The body ended: hands the copy over.
    pub fn end(mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(Ok(std::mem::take(&mut self.copy).freeze()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_arrives_at_the_end_within_the_cap() {
        let (mut tee, mut rx) = Tee::new(8);
        assert!(tee.data(&Bytes::from_static(b"abcd")));
        assert!(rx.try_recv().is_err(), "nothing before the end");
        assert!(tee.data(&Bytes::from_static(b"efgh")));
        tee.end();
        assert_eq!(rx.try_recv(), Ok(Ok(Bytes::from_static(b"abcdefgh"))));
    }

    #[test]
    fn past_the_cap_the_receiver_is_told_and_a_dropped_tee_closes_it() {
        let (mut tee, mut rx) = Tee::new(4);
        assert!(!tee.data(&Bytes::from_static(b"abcde")));
        assert_eq!(rx.try_recv(), Ok(Err(TeeError::TooLarge)));
        let (tee, mut rx) = Tee::new(4);
        drop(tee);
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }
}
