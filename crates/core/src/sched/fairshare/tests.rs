use super::*;

fn config(half_life_secs: f64, shares: &[(&str, f64)]) -> FairShareConfig {
    FairShareConfig {
        half_life_secs,
        shares: shares.iter().map(|(a, s)| (a.to_string(), *s)).collect(),
        default_share: 1.0,
        ..Default::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn usage_halves_every_half_life() {
    let mut fs = FairShare::new(config(100.0, &[]));
    fs.charge("physics", 800.0, 0.0);
    fs.decay_to(100.0);
    assert!(close(fs.usage["physics"], 400.0));
    fs.decay_to(300.0);
    assert!(close(fs.usage["physics"], 100.0));
    // Going back in time changes nothing.
    fs.decay_to(50.0);
    assert!(close(fs.usage["physics"], 100.0) && fs.as_of == 300.0);
}

#[test]
fn late_charges_are_decayed_from_when_they_happened() {
    let mut in_order = FairShare::new(config(100.0, &[]));
    in_order.charge("a", 100.0, 0.0);
    in_order.charge("a", 100.0, 100.0);
    let mut late = FairShare::new(config(100.0, &[]));
    late.charge("a", 100.0, 100.0);
    late.charge("a", 100.0, 0.0);
    assert!(close(in_order.usage["a"], late.usage["a"]));
    assert!(close(late.usage["a"], 150.0));
}

#[test]
fn factor_is_one_unused_half_at_share_and_falls_beyond() {
    let mut fs = FairShare::new(config(1e9, &[("a", 1.0), ("b", 1.0), ("idle", 2.0)]));
    // Nobody used anything: everybody is at 1.
    assert_eq!(fs.factor("a"), 1.0);
    fs.charge("a", 50.0, 0.0);
    fs.charge("b", 50.0, 0.0);
    // a has a quarter of the shares and half the usage: 2^(-0.5/0.25) = 0.25.
    assert!(close(fs.factor("a"), 0.25));
    assert_eq!(fs.factor("idle"), 1.0);
    // An unknown account counts with the default share and no usage.
    assert_eq!(fs.factor("newcomer"), 1.0);
    let mut at_share = FairShare::new(config(1e9, &[("a", 1.0), ("b", 3.0)]));
    at_share.charge("a", 25.0, 0.0);
    at_share.charge("b", 75.0, 0.0);
    assert!(close(at_share.factor("a"), 0.5) && close(at_share.factor("b"), 0.5));
}

#[test]
fn zero_share_accounts_drop_to_zero_once_they_use_anything() {
    let mut fs = FairShare::new(config(1e9, &[("guest", 0.0), ("staff", 1.0)]));
    assert_eq!(fs.factor("guest"), 1.0);
    fs.charge("guest", 1.0, 0.0);
    assert_eq!(fs.factor("guest"), 0.0);
    assert_eq!(fs.factor("staff"), 1.0);
}

#[test]
fn report_lists_every_known_account_in_order_with_normalized_shares() {
    let mut fs = FairShare::new(config(1e9, &[("b", 3.0), ("a", 1.0)]));
    fs.charge("c", 10.0, 0.0);
    fs.charge("a", 30.0, 0.0);
    let lines = fs.report();
    let names: Vec<&str> = lines.iter().map(|l| l.account.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    // c was never configured: it counts with the default share (1 of 5).
    let shares: Vec<f64> = lines.iter().map(|l| l.share).collect();
    assert!(close(shares[0], 0.2) && close(shares[1], 0.6) && close(shares[2], 0.2));
    assert!(close(lines.iter().map(|l| l.usage_fraction).sum::<f64>(), 1.0));
    assert!(close(lines[0].usage_fraction, 0.75));
    assert_eq!(lines[1].factor, 1.0);
    for l in &lines {
        assert!(close(l.factor, fs.factor(&l.account)), "{}", l.account);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Two groups with shares 1:3 keep a toy machine saturated: every step each CPU goes to the
    /// group with the higher factor (ties to the first), for a random number of steps of work.
    /// After ten half-lives their decayed usage is within 5% of the shares. (The machine is large
    /// enough and the steps short enough against the half-life that one job is a small part of
    /// the decayed usage, as on a real cluster: otherwise single picks swing the fractions.)
    #[test]
    fn two_groups_converge_to_their_shares(
        half_life in 3600.0f64..7200.0,
        step in 10.0f64..30.0,
        cpus in 4usize..32,
        lengths in proptest::collection::vec(1u32..5, 1..20),
    ) {
        let mut fs = FairShare::new(config(half_life, &[("small", 1.0), ("large", 3.0)]));
        let mut now = 0.0;
        let mut k = 0;
        while now < 10.0 * half_life {
            for _ in 0..cpus {
                let pick = if fs.factor("small") >= fs.factor("large") { "small" } else { "large" };
                // A job of a few steps, charged as it is picked.
                let length = lengths[k % lengths.len()] as f64;
                k += 1;
                fs.charge(pick, length * step / lengths.len() as f64, now);
            }
            now += step;
        }
        fs.decay_to(now);
        let lines = fs.report();
        let small = lines.iter().find(|l| l.account == "small").map_or(0.0, |l| l.usage_fraction);
        let large = lines.iter().find(|l| l.account == "large").map_or(0.0, |l| l.usage_fraction);
        proptest::prop_assert!((small - 0.25).abs() <= 0.05 * 0.25, "small group got {}", small);
        proptest::prop_assert!((large - 0.75).abs() <= 0.05 * 0.75, "large group got {}", large);
    }
}

#[test]
fn gpus_are_billed_by_their_weight_or_like_the_cpus_beside_them() {
    let mut c = config(100.0, &[]);
    assert!(close(c.billing(8, 0, 16.0), 8.0), "CPUs at weight 1");
    // Unset GPU weight: the automatic one (PUs per GPU on the GPU nodes).
    assert!(close(c.billing(8, 2, 16.0), 8.0 + 32.0));
    c.gpu_weight = Some(0.0);
    assert!(close(c.billing(8, 2, 16.0), 8.0), "GPUs not billed");
    c.gpu_weight = Some(100.0);
    c.cpu_weight = 0.5;
    assert!(close(c.billing(8, 2, 16.0), 4.0 + 200.0));
    assert!(c.check_weights().is_ok());
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(FairShareConfig { gpu_weight: Some(bad), ..config(1.0, &[]) }.check_weights(), Err(BadWeights));
        assert_eq!(FairShareConfig { cpu_weight: bad, ..config(1.0, &[]) }.check_weights(), Err(BadWeights));
    }
    assert!(BadWeights.to_string().starts_with("cpu_weight and gpu_weight must be numbers >= 0"));
    // 2 GPU nodes of 128 PUs and 8 GPUs, and CPU-only nodes (not counted): 16 PUs a GPU.
    assert!(close(auto_gpu_weight([(128, 8), (128, 8), (64, 0), (256, 0)]), 16.0));
    assert!(close(auto_gpu_weight([(64, 0)]), 0.0));
    assert!(close(auto_gpu_weight([]), 0.0));
}

/// Two accounts, one on GPUs: with GPUs billed, the GPU account's usage (and so its factor)
/// outweighs the CPU account's though both held as many CPUs.
#[test]
fn gpu_seconds_lower_the_factor() {
    let c = FairShareConfig { gpu_weight: Some(16.0), ..config(1e9, &[]) };
    let mut fs = FairShare::new(c.clone());
    fs.charge("cpu", c.billing(8, 0, 0.0) * 3600.0, 3600.0);
    fs.charge("gpu", c.billing(8, 4, 0.0) * 3600.0, 3600.0);
    assert!(close(fs.usage["gpu"], (8.0 + 64.0) * 3600.0));
    assert!(fs.factor("gpu") < fs.factor("cpu"), "{} vs {}", fs.factor("gpu"), fs.factor("cpu"));
    let unbilled = FairShareConfig { gpu_weight: Some(0.0), ..c };
    let mut fs = FairShare::new(unbilled.clone());
    fs.charge("cpu", unbilled.billing(8, 0, 0.0) * 3600.0, 3600.0);
    fs.charge("gpu", unbilled.billing(8, 4, 0.0) * 3600.0, 3600.0);
    assert!(close(fs.factor("gpu"), fs.factor("cpu")));
}

/// Issue 20: generic resources and licenses billed by their weights (Slurm's
/// `TRESBillingWeights=GRES/nvme=...,License/matlab=...`): per unit held, a typed resource
/// its own weight or else its name's, anything unlisted free; bad tables refused.
#[test]
fn gres_and_licenses_are_billed_by_their_weights() {
    let counts =
        |items: &[(&str, u32)]| -> crate::gres::Counts { items.iter().map(|(n, c)| (n.to_string(), *c)).collect() };
    let mut c = config(100.0, &[]);
    let gres = counts(&[("nvme", 100), ("nvme:fast", 10), ("fpga", 1)]);
    let lic = counts(&[("matlab", 2), ("ansys", 3)]);
    assert!(close(c.counts_billing(&gres, &lic), 0.0), "nothing weighted: nothing billed");
    c.gres_weights.insert("nvme".into(), 0.01);
    c.gres_weights.insert("nvme:fast".into(), 0.5);
    c.license_weights.insert("matlab".into(), 8.0);
    // nvme 100 x 0.01 + nvme:fast 10 x 0.5 + fpga unweighted + matlab 2 x 8 + ansys unweighted.
    assert!(close(c.counts_billing(&gres, &lic), 1.0 + 5.0 + 16.0), "{}", c.counts_billing(&gres, &lic));
    // A type without its own weight takes its name's.
    assert!(close(c.counts_billing(&counts(&[("nvme:slow", 200)]), &counts(&[])), 2.0));
    assert!(c.check_weights().is_ok());
    for (table, key, w) in
        [("gres", "nvme", -1.0), ("gres", "bad name", 1.0), ("lic", "matlab", f64::NAN), ("lic", "a:b", 1.0)]
    {
        let mut bad = config(1.0, &[]);
        match table {
            "gres" => bad.gres_weights.insert(key.into(), w),
            _ => bad.license_weights.insert(key.into(), w),
        };
        assert_eq!(bad.check_weights(), Err(BadWeights), "{table} {key} {w}");
    }
    let mut many = config(1.0, &[]);
    many.license_weights = (0..=MAX_WEIGHTS).map(|i| (format!("l{i}"), 1.0)).collect();
    assert_eq!(many.check_weights(), Err(BadWeights));
    // Serialized (the tables left out when empty, so older readers parse it) and read back.
    let plain = serde_json::to_string(&config(1.0, &[])).unwrap();
    assert!(!plain.contains("gres_weights") && !plain.contains("license_weights"), "{plain}");
    let t: FairShareConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(t, c);
}
