//! `scenario security` end to end in the netns testbed (needs root; fails
//! instead of skipping when `CI` is set): every attack refused, nothing
//! changed, refusals in the history; then agent h0's certificate is
//! revoked (the cluster stops hearing it) and renewed with SIGHUP (heard
//! again without a restart).

use testbed::require_root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_is_refused_and_changes_nothing() {
    if !require_root("security_netns").unwrap() {
        return;
    }
    let r = chaos_tests::security::run().await.unwrap();
    let accepted: Vec<_> = r.details.iter().filter(|d| !d.refused).collect();
    assert!(accepted.is_empty(), "accepted: {accepted:#?}");
    assert!(r.attempts >= 18, "{} attempts", r.attempts);
    assert_eq!(r.state_changed_by_refused, 0);
    assert!(r.refusals_in_history >= 3, "{}", r.refusals_in_history);
    assert!(
        r.rotation_silenced_ms.is_some(),
        "revoked agent still heard"
    );
    assert!(
        r.rotation_back_ms.is_some(),
        "renewed agent not heard again"
    );
    assert!(r.ok);
}
