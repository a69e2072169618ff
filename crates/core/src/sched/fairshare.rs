//! Equal-access fair share: usage per account (project or group), decaying with a half-life,
//! compared with each account's configured share.
//!
//! The factor is Slurm's classic `2^(-usage_fraction / share_fraction)`: 1 for an account that
//! used nothing, 0.5 for one exactly at its share, towards 0 the more it is over. Shares are
//! normalized over the accounts known (configured, or with usage), so an account nobody
//! configured counts with `default_share`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Fair-share settings (`[fair_share]` in the controller's config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FairShareConfig {
    /// Seconds for past usage to count half as much.
    pub half_life_secs: f64,
    /// Shares per account; accounts not listed get `default_share`.
    pub shares: BTreeMap<String, f64>,
    pub default_share: f64,
    /// What a CPU (PU) held for a second is billed (Slurm's `TRESBillingWeights` `CPU=`).
    pub cpu_weight: f64,
    /// What a GPU held for a second is billed (`GRES/gpu=`). Unset: what the CPUs beside a
    /// GPU cost, the cluster's PUs per GPU on its GPU nodes ([`auto_gpu_weight`]), so a job
    /// holding a GPU node's GPUs is billed like the whole node; 0 bills no GPU.
    pub gpu_weight: Option<f64>,
    /// What one unit of a generic resource held for a second is billed, by name (Slurm's
    /// `GRES/nvme=`), or by `NAME:TYPE` for one type (`"nvme:fast"`, over the name's weight);
    /// resources not listed are not billed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gres_weights: BTreeMap<String, f64>,
    /// What one license held for a second is billed, by name (Slurm's `License/matlab=`);
    /// licenses not listed are not billed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub license_weights: BTreeMap<String, f64>,
}

/// The most entries of `gres_weights` or `license_weights`.
pub const MAX_WEIGHTS: usize = 256;

impl Default for FairShareConfig {
    fn default() -> Self {
        FairShareConfig {
            half_life_secs: 7.0 * 86400.0,
            shares: BTreeMap::new(),
            default_share: 1.0,
            cpu_weight: 1.0,
            gpu_weight: None,
            gres_weights: BTreeMap::new(),
            license_weights: BTreeMap::new(),
        }
    }
}

impl FairShareConfig {
    /// A job's billing rate (billed units a second) for `cpus` PUs and `gpus` GPUs held, like
    /// Slurm's TRES billing: `cpu_weight x cpus + gpu_weight x gpus`, the GPU weight
    /// `auto_gpu` (see [`auto_gpu_weight`]) when none is set. Charged as usage per second.
    pub fn billing(&self, cpus: u64, gpus: u64, auto_gpu: f64) -> f64 {
        self.cpu_weight * cpus as f64 + self.gpu_weight.unwrap_or(auto_gpu) * gpus as f64
    }

    /// What generic resources `gres` (keys as a node's: `nvme`, `nvme:fast`) and licenses
    /// `licenses` held are billed a second, over [`Self::billing`]: each unit its weight in
    /// `gres_weights` (a typed key's own, else its name's) or `license_weights`, 0 if none.
    pub fn counts_billing(&self, gres: &crate::gres::Counts, licenses: &crate::gres::Counts) -> f64 {
        if self.gres_weights.is_empty() && self.license_weights.is_empty() {
            return 0.0;
        }
        let gres_weight = |key: &str| {
            self.gres_weights
                .get(key)
                .or_else(|| self.gres_weights.get(crate::gres::split_key(key).0))
                .copied()
                .unwrap_or(0.0)
        };
        let g: f64 = gres.iter().map(|(k, &n)| gres_weight(k) * f64::from(n)).sum();
        let l: f64 =
            licenses.iter().map(|(k, &n)| self.license_weights.get(k).copied().unwrap_or(0.0) * f64::from(n)).sum();
        g + l
    }

    /// The GPU weight billing uses on a cluster of `nodes`: `gpu_weight` when set, else
    /// [`auto_gpu_weight`] of the nodes (worked out only then). The one rule the controller's
    /// fair-share charge, its views (`billing`) and the simulator share.
    pub fn gpu_weight_on(&self, nodes: &[crate::node::NodeCapacity]) -> f64 {
        self.gpu_weight.unwrap_or_else(|| {
            auto_gpu_weight(nodes.iter().map(|n| (n.topology.pu_count() as u64, n.topology.gpus.len() as u64)))
        })
    }

    /// Why the weights cannot be used, if so (negative or not finite).
    pub fn check_weights(&self) -> Result<(), BadWeights> {
        let ok = |w: f64| w >= 0.0 && w.is_finite();
        if !ok(self.cpu_weight) || !self.gpu_weight.is_none_or(ok) {
            return Err(BadWeights);
        }
        for (table, weights) in [("gres_weights", &self.gres_weights), ("license_weights", &self.license_weights)] {
            if weights.len() > MAX_WEIGHTS {
                return Err(BadWeights);
            }
            let key_ok = |k: &String| match table {
                "gres_weights" => crate::gres::valid_key(k),
                _ => crate::gres::valid_name(k),
            };
            if weights.iter().any(|(k, w)| !ok(*w) || !key_ok(k)) {
                return Err(BadWeights);
            }
        }
        Ok(())
    }
}

/// Billing weights that cannot be used ([`FairShareConfig::check_weights`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cpu_weight and gpu_weight must be numbers >= 0 (billed units a CPU or GPU a second); gres_weights and license_weights at most 256 entries, each a resource name (gres: NAME or NAME:TYPE) = a number >= 0 (billed units one held a second)")]
pub struct BadWeights;

/// The GPU weight of a cluster whose config sets none: the PUs of its GPU nodes per GPU there
/// (`nodes`: each node's PUs and GPUs), so a GPU is billed like the CPUs that come with it; 0
/// on a cluster without GPUs.
pub fn auto_gpu_weight(nodes: impl IntoIterator<Item = (u64, u64)>) -> f64 {
    let (mut pus, mut gpus) = (0u64, 0u64);
    for (p, g) in nodes.into_iter().filter(|&(_, g)| g > 0) {
        pus = pus.saturating_add(p);
        gpus = gpus.saturating_add(g);
    }
    if gpus == 0 {
        0.0
    } else {
        pus as f64 / gpus as f64
    }
}

/// Decayed usage per account, as of `as_of` (seconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FairShare {
    pub config: FairShareConfig,
    /// Billed CPU-seconds ([`FairShareConfig::billing`] x seconds), decayed to `as_of`.
    pub usage: BTreeMap<String, f64>,
    pub as_of: f64,
}

/// One account's line in `berth share`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareLine {
    pub account: String,
    /// Configured share, normalized over the accounts known (sums to 1).
    pub share: f64,
    /// Decayed usage, billed CPU-seconds (CPU-seconds when GPUs are not billed).
    pub usage: f64,
    /// Fraction of all decayed usage (sums to 1, or 0 when there is none).
    pub usage_fraction: f64,
    /// Priority factor in [0, 1]: 1 for an account that used nothing, 0.5 at its share.
    pub factor: f64,
}

impl FairShare {
    pub fn new(config: FairShareConfig) -> Self {
        FairShare { config, usage: BTreeMap::new(), as_of: 0.0 }
    }

    /// How much usage recorded at `from` still counts at `to` (`to >= from`).
    fn decay_factor(&self, from: f64, to: f64) -> f64 {
        let elapsed = to - from;
        if elapsed <= 0.0 || !elapsed.is_finite() {
            return 1.0;
        }
        if self.config.half_life_secs > 0.0 {
            0.5f64.powf(elapsed / self.config.half_life_secs)
        } else {
            // No half-life: the past is forgotten at once.
            0.0
        }
    }

    /// Decay all usage to `now` (no-op if `now <= as_of`).
    pub fn decay_to(&mut self, now: f64) {
        if now <= self.as_of || now.is_nan() {
            return;
        }
        let keep = self.decay_factor(self.as_of, now);
        for used in self.usage.values_mut() {
            *used *= keep;
        }
        self.as_of = now;
    }

    /// Add `cpu_seconds` of use by `account` at `now`. Use charged for a moment before `as_of`
    /// is decayed from that moment, so the order of charges does not matter.
    pub fn charge(&mut self, account: &str, cpu_seconds: f64, now: f64) {
        if !(cpu_seconds > 0.0 && cpu_seconds.is_finite()) {
            return;
        }
        self.decay_to(now);
        let amount = cpu_seconds * self.decay_factor(now, self.as_of);
        match self.usage.get_mut(account) {
            Some(used) => *used += amount,
            None => {
                self.usage.insert(account.to_string(), amount);
            }
        }
    }

    /// The configured share of `account` (negative shares count as none).
    fn raw_share(&self, account: &str) -> f64 {
        self.config.shares.get(account).copied().unwrap_or(self.config.default_share).max(0.0)
    }

    /// Sum of the shares of the known accounts, plus `extra`'s if it is not one of them.
    fn total_share(&self, extra: Option<&str>) -> f64 {
        let known: f64 = self.accounts().map(|a| self.raw_share(a)).sum();
        match extra {
            Some(a) if !self.config.shares.contains_key(a) && !self.usage.contains_key(a) => known + self.raw_share(a),
            _ => known,
        }
    }

    /// Accounts that appear in the configured shares or in the usage, sorted.
    fn accounts(&self) -> impl Iterator<Item = &str> {
        let mut names: Vec<&str> = self.config.shares.keys().chain(self.usage.keys()).map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        names.into_iter()
    }

    fn total_usage(&self) -> f64 {
        self.usage.values().sum()
    }

    /// `2^(-usage_fraction / share_fraction)`; an account with no share gets 0 once it used
    /// anything (1 before).
    fn factor_of(usage_fraction: f64, share_fraction: f64) -> f64 {
        if usage_fraction <= 0.0 {
            1.0
        } else if share_fraction <= 0.0 {
            0.0
        } else {
            2f64.powf(-usage_fraction / share_fraction).clamp(0.0, 1.0)
        }
    }

    /// The account's fair-share factor in [0, 1] (Slurm's classic 2^(-usage/share)).
    pub fn factor(&self, account: &str) -> f64 {
        let total_usage = self.total_usage();
        let used = self.usage.get(account).copied().unwrap_or(0.0);
        let usage_fraction = if total_usage > 0.0 { used / total_usage } else { 0.0 };
        let total_share = self.total_share(Some(account));
        let share_fraction = if total_share > 0.0 { self.raw_share(account) / total_share } else { 0.0 };
        Self::factor_of(usage_fraction, share_fraction)
    }

    /// Every known account's line, sorted by account.
    pub fn report(&self) -> Vec<ShareLine> {
        let total_usage = self.total_usage();
        let total_share = self.total_share(None);
        self.accounts()
            .map(|account| {
                let usage = self.usage.get(account).copied().unwrap_or(0.0);
                let share = if total_share > 0.0 { self.raw_share(account) / total_share } else { 0.0 };
                let usage_fraction = if total_usage > 0.0 { usage / total_usage } else { 0.0 };
                ShareLine {
                    account: account.to_string(),
                    share,
                    usage,
                    usage_fraction,
                    factor: Self::factor_of(usage_fraction, share),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
