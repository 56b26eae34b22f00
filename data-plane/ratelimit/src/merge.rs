//! Merging concurrent decisions of one budget into one Redis call.
//!
//! Under load, many requests of one key (a busy user, a client IP behind one
//! NAT) wait on Redis at the same time. Instead of one script run each, the
//! first request of a key runs the script alone; requests of that key arriving
//! while it is in flight queue up, and the first of them then runs the script
//! once for the whole queue with `requests = n`. The script admits as many as
//! the budget holds, in arrival order — exactly what `n` single runs at that
//! instant would admit — so merging changes the number of Redis calls, never
//! the verdicts. A key has at most one run in flight; a queued request waits
//! for at most one run before its own; different keys never wait on each other.
//!
//! Deadlines belong to runs, not to queued requests. A leader waits for its
//! run at most one decision deadline, then decides locally (as on any Redis
//! timeout). A [`Lead`] owns everything it needs ('static), so when the
//! leader's deadline passes a run with followers is not abandoned: it goes on
//! in a task of its own for at most one more deadline and still answers the
//! followers; past that it is dropped and they decide locally (see
//! `run_owned` in [`crate::limiter`]). So every run ends within two deadlines
//! of its start, and a queued request, which waits for the run in flight and
//! then for its own, is answered within four (only while Redis stalls)
//! without a timer of its own: one timer per batch, not one per request. A
//! run that fails makes every request of its batch decide locally. A
//! leader that is cancelled mid-run (its client went away) still hands the
//! key on, through [`Lead`]'s `Drop`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::algorithm::Outcome;

/// Most requests queued behind one key's run; beyond that a request asks
/// Redis on its own (correct, just not merged).
pub(crate) const MAX_QUEUED: usize = 512;

/// The answer of one script run deciding `requests` requests of one key (or
/// of one set of stacked keys: then `*_limit` say which limit describes the
/// admitted and the refused requests, see [`crate::stacked::shaping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Requests decided together.
    pub(crate) requests: u32,
    /// How many of them, first to last, were admitted.
    pub(crate) admitted: u32,
    /// The limit describing the admitted ones (0 for a single limit).
    pub(crate) allow_limit: usize,
    /// Its budget left after the batch, as this replica sees it: what Redis
    /// reported left plus the tokens `leased` with the batch.
    pub(crate) remaining: u64,
    /// Milliseconds until its whole budget is back, after the batch.
    pub(crate) reset_after_ms: u64,
    /// The limit that refused the rest (0 for a single limit).
    pub(crate) deny_limit: usize,
    /// Milliseconds until that limit's whole budget is back.
    pub(crate) deny_reset_after_ms: u64,
    /// For the denied ones: milliseconds until one request would be admitted.
    pub(crate) retry_after_ms: u64,
    /// Tokens the run took beyond the batch's requests, for this replica's
    /// lease ([`crate::lease`]); non-zero only when every request was admitted.
    pub(crate) leased: u32,
}

impl Batch {
    /// The batch of a single limit.
    pub(crate) fn single(
        requests: u32,
        admitted: u32,
        remaining: u64,
        reset_after_ms: u64,
        retry_after_ms: u64,
    ) -> Self {
        Self {
            requests,
            admitted,
            allow_limit: 0,
            remaining,
            reset_after_ms,
            deny_limit: 0,
            deny_reset_after_ms: reset_after_ms,
            retry_after_ms,
            leased: 0,
        }
    }

    /// The batch of a single-limit run that asked for `requests + extra`
    /// tokens and got `admitted` of them, with Redis's `remaining` after the
    /// run: the batch's requests get the first tokens, in arrival order, and
    /// whatever was admitted beyond them is the lease.
    pub(crate) fn leasing(
        requests: u32,
        admitted: u32,
        remaining: u64,
        reset_after_ms: u64,
        retry_after_ms: u64,
    ) -> Self {
        let leased = admitted.saturating_sub(requests);
        let admitted = admitted.min(requests);
        Self {
            leased,
            ..Self::single(
                requests,
                admitted,
                remaining + u64::from(leased),
                reset_after_ms,
                // The batch's own requests were all admitted: none waits.
                if admitted == requests {
                    0
                } else {
                    retry_after_ms
                },
            )
        }
    }

    /// The outcome of the request at `position` (0: the first in arrival
    /// order), as it would have been had the requests come one by one, with
    /// the index of the limit that describes it.
    pub(crate) fn verdict(&self, position: u32) -> (usize, Outcome) {
        if position < self.admitted {
            (
                self.allow_limit,
                Outcome {
                    allowed: true,
                    remaining: self.remaining + u64::from(self.admitted - 1 - position),
                    reset_after_ms: self.reset_after_ms,
                    retry_after_ms: 0,
                },
            )
        } else {
            (
                self.deny_limit,
                Outcome {
                    allowed: false,
                    remaining: 0,
                    reset_after_ms: self.deny_reset_after_ms,
                    retry_after_ms: self.retry_after_ms,
                },
            )
        }
    }
}

/// What a queued request is told.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Its verdict, from a run another request led, with the index of the
    /// limit describing it (0 unless limits are stacked).
    Decided(Outcome, usize),
    /// The run failed or timed out: decide locally.
    Failed,
    /// Run the script now, for itself (position 0) and these queued requests.
    Lead(Vec<oneshot::Sender<Turn>>),
}

/// What [`Merger::join`] makes of a request.
#[derive(Debug)]
pub(crate) enum Role {
    /// Run the script for this request alone and then hand the key on.
    Lead(Lead),
    /// Wait for a verdict, or for the lead.
    Queued(Queued),
    /// The queue is full: ask Redis on its own, outside the merging.
    Alone,
}

/// A request waiting in a key's queue.
///
/// If it stops waiting (its client went away) just as it is
/// handed the lead, dropping it passes the lead on — otherwise the key would
/// stay taken with no one to run it.
#[derive(Debug)]
pub(crate) struct Queued {
    merger: Merger,
    key: Vec<u8>,
    rx: Option<oneshot::Receiver<Turn>>,
}

impl Queued {
    /// Waits for the verdict or the lead: at most until the run in flight and
    /// then its own have ended, each within two decision deadlines of its start
    /// (see the module documentation). `None`: the run was abandoned without an
    /// answer: decide locally.
    pub(crate) async fn wait(mut self) -> Option<Turn> {
        let rx = self.rx.as_mut()?;
        let turn = rx.await.ok()?;
        self.rx = None;
        Some(turn)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        if let Ok(Turn::Lead(followers)) = rx.try_recv() {
            self.merger
                .lead(std::mem::take(&mut self.key), followers)
                .pass_on();
        }
    }
}

/// The keys with a run in flight, each with the requests queued behind it.
///
/// Cheap to clone (one `Arc`): a [`Lead`] owns a handle, so a run can outlive
/// the request that started it (see [`crate::limiter`]: a batch's run goes on
/// in a task of its own when its leader's deadline passes, for its followers).
#[derive(Debug, Default, Clone)]
pub(crate) struct Merger {
    keys: Arc<Mutex<Queues>>,
}

/// Per key with a run in flight: the requests queued behind it.
type Queues = HashMap<Vec<u8>, Vec<oneshot::Sender<Turn>>>;

impl Merger {
    /// Enters a request of budget `key`.
    pub(crate) fn join(&self, key: &[u8]) -> Role {
        let mut keys = self.keys.lock();
        match keys.get_mut(key) {
            Some(queue) if queue.len() >= MAX_QUEUED => Role::Alone,
            Some(queue) => {
                let (tx, rx) = oneshot::channel();
                queue.push(tx);
                Role::Queued(Queued {
                    merger: self.clone(),
                    key: key.to_vec(),
                    rx: Some(rx),
                })
            }
            None => {
                keys.insert(key.to_vec(), Vec::new());
                Role::Lead(Lead {
                    merger: self.clone(),
                    key: key.to_vec(),
                    followers: Vec::new(),
                    registered: true,
                })
            }
        }
    }

    /// Makes a request that was told [`Turn::Lead`] the leader of its batch.
    pub(crate) fn lead(&self, key: Vec<u8>, followers: Vec<oneshot::Sender<Turn>>) -> Lead {
        Lead {
            merger: self.clone(),
            key,
            followers,
            registered: true,
        }
    }

    /// A run for one request outside the merging ([`Role::Alone`]): it answers
    /// no one and hands nothing on.
    pub(crate) fn lead_alone(&self, key: Vec<u8>) -> Lead {
        Lead {
            merger: self.clone(),
            key,
            followers: Vec::new(),
            registered: false,
        }
    }

    /// After a run of `key`: the queued requests become the next batch (the
    /// first one still waiting leads it), or the key is released.
    fn hand_on(&self, key: &[u8]) {
        loop {
            let queue = {
                let mut keys = self.keys.lock();
                match keys.get_mut(key) {
                    None => return,
                    Some(queue) if queue.is_empty() => {
                        keys.remove(key);
                        return;
                    }
                    Some(queue) => std::mem::take(queue),
                }
            };
            let mut rest = queue;
            while !rest.is_empty() {
                let next = rest.remove(0);
                match next.send(Turn::Lead(rest)) {
                    Ok(()) => return,
                    // That request stopped waiting (its client went away): the next one leads.
                    Err(Turn::Lead(back)) => rest = back,
                    Err(_) => return,
                }
            }
            // Every queued request had given up; requests may have queued meanwhile.
        }
    }

    /// Keys with a run in flight (for tests).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.keys.lock().len()
    }
}

/// The leader of one run: answers its followers and, when dropped, hands the
/// key on — also when the run never finished.
#[derive(Debug)]
pub(crate) struct Lead {
    merger: Merger,
    key: Vec<u8>,
    followers: Vec<oneshot::Sender<Turn>>,
    /// Whether the key's queue is this run's to hand on.
    registered: bool,
}

impl Lead {
    /// The budget key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// Requests the run decides: the leader and its followers.
    pub(crate) fn requests(&self) -> u32 {
        u32::try_from(self.followers.len() + 1).unwrap_or(u32::MAX)
    }

    /// Gives the lead to the first follower still waiting (with the rest as its
    /// followers), for a leader that will not run the script itself.
    pub(crate) fn pass_on(mut self) {
        let mut rest = std::mem::take(&mut self.followers);
        while !rest.is_empty() {
            let next = rest.remove(0);
            match next.send(Turn::Lead(rest)) {
                Ok(()) => {
                    // The new leader hands the key on when its run ends.
                    self.registered = false;
                    return;
                }
                Err(Turn::Lead(back)) => rest = back,
                Err(_) => return,
            }
        }
        // No follower left: dropping `self` hands the key to the queue, or releases it.
    }

    /// Tells every follower its verdict; returns the leader's own (position 0).
    pub(crate) fn decided(mut self, batch: &Batch) -> (usize, Outcome) {
        for (i, follower) in self.followers.drain(..).enumerate() {
            let position = u32::try_from(i + 1).unwrap_or(u32::MAX);
            let (limit, outcome) = batch.verdict(position);
            // A follower that stopped waiting has decided locally already.
            let _ = follower.send(Turn::Decided(outcome, limit));
        }
        batch.verdict(0)
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // Followers not told a verdict (the run failed or was cancelled) decide locally.
        for follower in self.followers.drain(..) {
            let _ = follower.send(Turn::Failed);
        }
        if self.registered {
            self.merger.hand_on(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(requests: u32, admitted: u32) -> Batch {
        Batch::single(requests, admitted, 5, 900, 300)
    }

    #[test]
    fn outcomes_are_those_of_sequential_requests() {
        let b = batch(4, 2);
        // Admitted ones count down to the remaining budget, as one-by-one answers would.
        assert_eq!(b.verdict(0).1.remaining, 6);
        assert_eq!(b.verdict(1).1.remaining, 5);
        assert!(b.verdict(0).1.allowed && b.verdict(1).1.allowed);
        for p in [2, 3] {
            let o = b.verdict(p).1;
            assert!(!o.allowed);
            assert_eq!((o.remaining, o.retry_after_ms), (0, 300));
        }
        assert_eq!(b.verdict(0).1.retry_after_ms, 0);
    }

    #[test]
    fn the_first_request_leads_and_the_rest_queue() {
        let m = Merger::default();
        let Role::Lead(lead) = m.join(b"k") else {
            panic!("first leads")
        };
        assert!(matches!(m.join(b"k"), Role::Queued(_)));
        assert!(matches!(m.join(b"other"), Role::Lead(_)));
        assert_eq!(lead.requests(), 1);
        drop(lead);
    }

    #[tokio::test]
    async fn queued_requests_form_the_next_batch_led_by_the_first() {
        let m = Merger::default();
        let Role::Lead(first) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(a) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(b) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(c) = m.join(b"k") else {
            panic!()
        };
        assert!(first.decided(&batch(1, 1)).1.allowed);
        // `a` leads the next run for itself, `b` and `c`.
        let Turn::Lead(followers) = a.wait().await.unwrap() else {
            panic!("a leads")
        };
        assert_eq!(followers.len(), 2);
        let second = m.lead(b"k".to_vec(), followers);
        assert_eq!(second.requests(), 3);
        assert!(second.decided(&batch(3, 2)).1.allowed);
        match (b.wait().await.unwrap(), c.wait().await.unwrap()) {
            (Turn::Decided(ob, 0), Turn::Decided(oc, 0)) => {
                assert!(ob.allowed);
                assert!(!oc.allowed);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(m.in_flight(), 0, "the key is released");
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_run_fails_its_followers_and_hands_the_key_on() {
        let m = Merger::default();
        let Role::Lead(first) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(a) = m.join(b"k") else {
            panic!()
        };
        drop(first);
        let Turn::Lead(none) = a.wait().await.unwrap() else {
            panic!()
        };
        let Role::Queued(b) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(c) = m.join(b"k") else {
            panic!()
        };
        // `b` gave up waiting (its client went away): `c` leads the run after this one.
        drop(b);
        let lead = m.lead(b"k".to_vec(), none);
        drop(lead);
        assert!(matches!(c.wait().await.unwrap(), Turn::Lead(f) if f.is_empty()));
        // A run that failed with followers tells them.
        let Role::Queued(d) = m.join(b"k") else {
            panic!()
        };
        let Turn::Lead(_) = ({
            let l = m.lead(b"k".to_vec(), Vec::new());
            drop(l);
            d.wait().await.unwrap()
        }) else {
            panic!()
        };
        let (tx, rx) = oneshot::channel();
        drop(m.lead(b"k".to_vec(), vec![tx]));
        assert!(matches!(rx.await.unwrap(), Turn::Failed));
        assert_eq!(m.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_request_that_stops_waiting_as_it_is_handed_the_lead_passes_it_on() {
        let m = Merger::default();
        let Role::Lead(first) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(a) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(b) = m.join(b"k") else {
            panic!()
        };
        // The run ends and hands the lead to `a` (with `b` as follower) ...
        assert!(first.decided(&batch(1, 1)).1.allowed);
        // ... but `a` gave up at that very moment, without reading it.
        drop(a);
        let Turn::Lead(followers) = b.wait().await.unwrap() else {
            panic!("b leads instead")
        };
        assert!(followers.is_empty());
        drop(m.lead(b"k".to_vec(), followers));
        assert_eq!(m.in_flight(), 0, "the key is not left taken");
    }

    #[test]
    fn a_full_queue_sends_requests_alone() {
        let m = Merger::default();
        let Role::Lead(_lead) = m.join(b"k") else {
            panic!()
        };
        let _queued: Vec<_> = (0..MAX_QUEUED).map(|_| m.join(b"k")).collect();
        assert!(matches!(m.join(b"k"), Role::Alone));
        // A lone run leaves the key's queue to its leader.
        drop(m.lead_alone(b"k".to_vec()));
        assert_eq!(m.in_flight(), 1);
    }

    #[tokio::test]
    async fn a_lead_outlives_its_leader_and_still_answers_its_followers() {
        let m = Merger::default();
        let Role::Lead(first) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(a) = m.join(b"k") else {
            panic!()
        };
        let Role::Queued(b) = m.join(b"k") else {
            panic!()
        };
        drop(first);
        let Turn::Lead(followers) = a.wait().await.unwrap() else {
            panic!("a leads")
        };
        // `a`'s deadline passes: its run moves into a task of its own (the
        // Lead is 'static) and answers `b` when it ends.
        let lead = m.lead(b"k".to_vec(), followers);
        let (go, ready) = oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            ready.await.unwrap();
            lead.decided(&batch(2, 2)).1
        });
        go.send(()).unwrap();
        assert!(run.await.unwrap().allowed);
        match b.wait().await.unwrap() {
            Turn::Decided(o, 0) => assert!(o.allowed && o.remaining == 5),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.in_flight(), 0);
    }

    #[test]
    fn a_stacked_batch_names_the_limit_of_each_verdict() {
        let b = Batch {
            allow_limit: 2,
            deny_limit: 1,
            deny_reset_after_ms: 7_000,
            ..Batch::single(3, 1, 4, 900, 300)
        };
        assert_eq!(b.verdict(0).0, 2);
        assert_eq!(b.verdict(0).1.remaining, 4);
        let (limit, o) = b.verdict(1);
        assert_eq!(limit, 1);
        assert!(!o.allowed);
        assert_eq!((o.reset_after_ms, o.retry_after_ms), (7_000, 300));
    }

    #[test]
    fn a_leasing_run_gives_the_batch_the_first_tokens_and_keeps_the_rest() {
        // Asked for 3 + 10, got 8: all three admitted, five leased, and the
        // verdicts count the lease as budget still left to this replica.
        let b = Batch::leasing(3, 8, 100, 900, 50);
        assert_eq!((b.admitted, b.leased, b.retry_after_ms), (3, 5, 0));
        let remaining: Vec<u64> = (0..3).map(|p| b.verdict(p).1.remaining).collect();
        assert_eq!(remaining, [107, 106, 105]);
        // Got fewer than the batch needs: nothing is leased and the rest wait.
        let b = Batch::leasing(3, 2, 0, 900, 50);
        assert_eq!((b.admitted, b.leased, b.retry_after_ms), (2, 0, 50));
        assert!(!b.verdict(2).1.allowed);
        // Nothing extra asked for: the same as a plain single-limit batch.
        assert_eq!(
            Batch::leasing(3, 3, 7, 900, 0),
            Batch::single(3, 3, 7, 900, 0)
        );
    }
}
