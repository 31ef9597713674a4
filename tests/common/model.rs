//! The reference model of docs/design.md section 1, shared by the property tests of every store.

#![allow(dead_code)]

use tollgate::{Outcome, Quota};

/// The reference: docs/design.md section 1 transcribed with wide integers and no cleverness.
pub struct Model {
    /// (T, tau) per quota, in nanoseconds.
    quotas: Vec<(u128, u128)>,
    /// Stored TAT per key per quota; absent = never seen.
    tats: std::collections::HashMap<u8, Vec<u128>>,
}

#[derive(Debug, PartialEq)]
pub struct Answer {
    pub outcome: Outcome,
    pub retry_after: Option<u128>,
    pub remaining: Vec<u128>,
    pub reset_after: u128,
}

impl Model {
    pub fn new(quotas: &[Quota]) -> Self {
        Model {
            quotas: quotas
                .iter()
                .map(|q| {
                    let t = q.emission_interval().as_nanos();
                    (t, t * u128::from(q.burst_size()))
                })
                .collect(),
            tats: Default::default(),
        }
    }

    pub fn decide(&mut self, key: u8, now: u128, cost: u32) -> Answer {
        let n = self.quotas.len();
        let tats = self.tats.get(&key).cloned().unwrap_or(vec![now; n]);
        let c = u128::from(cost);
        let mut never = false;
        let mut retry: Option<u128> = None;
        let mut new_tats = Vec::new();
        for (&(t, tau), &tat) in self.quotas.iter().zip(&tats) {
            if c * t > tau {
                never = true;
            }
            let new_tat = tat.max(now) + c * t;
            if new_tat - now > tau {
                let r = new_tat - tau - now;
                retry = Some(retry.map_or(r, |x: u128| x.max(r)));
            }
            new_tats.push(new_tat);
        }
        let outcome = if never {
            Outcome::Exceeds
        } else if retry.is_some() {
            Outcome::Limited
        } else {
            Outcome::Allowed
        };
        let stored = if outcome == Outcome::Allowed && cost > 0 {
            self.tats.insert(key, new_tats.clone());
            new_tats
        } else {
            tats
        };
        let remaining = self
            .quotas
            .iter()
            .zip(&stored)
            .map(|(&(t, tau), &tat)| (tau - tat.saturating_sub(now).min(tau)) / t)
            .collect();
        let reset_after = stored
            .iter()
            .map(|&tat| tat.saturating_sub(now))
            .max()
            .unwrap_or(0);
        Answer {
            outcome,
            retry_after: (outcome == Outcome::Limited).then(|| retry.unwrap_or(0)),
            remaining,
            reset_after,
        }
    }
}
