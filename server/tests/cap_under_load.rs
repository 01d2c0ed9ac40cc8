//! The cap under load through the real `vaultcap serve` binary, sized for
//! CI (`vaultcap bench cap` runs the full 10,000 charges), with hostile
//! calls mixed among the charges.

use server::cli::bench::cap::Load;

fn load(kills: usize) -> Load {
    Load {
        binary: env!("CARGO_BIN_EXE_vaultcap").into(),
        charges: 2_000,
        concurrency: 64,
        admits: 500,
        kills,
        hostile: 300,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_charges_at_one_key_admit_exactly_what_the_cap_allows() {
    let report = load(0).run().await.unwrap();
    report.check_exact().unwrap();
    assert_eq!(report.succeeded, 500);
    assert_eq!(report.upstream_charges, 500);
    assert_eq!(report.spent_cents, report.cap_cents);
    assert_eq!(report.audit_rows, 2_000, "one audit row per charge");
    assert_eq!(report.hostile_audit_rows, 300, "and one per hostile call");
    assert!(report.hostile_not_refused.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_proxy_mid_run_never_lets_a_cent_over_the_cap() {
    let report = load(2).run().await.unwrap();
    report.check_held().unwrap();
    assert!(
        report.retries > 0,
        "the kills broke calls in flight: {report:?}"
    );
    assert!(report.upstream_cents <= report.cap_cents);
    assert_eq!(report.audited_charges, 2_000);
    assert_eq!(report.unreserved_upstream_charges, 0);
}

/// Three instances behind HAProxy, health-checked on /readyz: one killed
/// and one drained while 64 clients charge. Clients retry what broke with
/// the same Idempotency-Key: never a cent over the cap, every charge
/// audited, no charge made twice or made without a reservation.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_behind_haproxy_holds_the_cap_with_one_instance_killed_and_one_drained() {
    let report = load(0).run_behind_haproxy().await.unwrap();
    report.print("behind HAProxy");
    report.check_held().unwrap();
    assert!(
        report.retries > 0,
        "the kill broke calls in flight: {report:?}"
    );
    assert!(report.upstream_cents <= report.cap_cents);
    assert_eq!(report.audited_charges, 2_000);
    assert_eq!(report.unreserved_upstream_charges, 0);
    assert_eq!(report.unaudited_successes, 0);
}
