//! Playbooks through a real supervisor cluster and the real CLI: the
//! `bad-playbooks` scenario (library applied; every invalid corpus file
//! refused by the CLI and by the API with its location; state unchanged),
//! then delete and plan refusals.

use chaos_tests::playbook_scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_playbooks_are_refused_with_their_location_and_change_nothing() {
    let r = playbook_scenarios::bad_playbooks().await.unwrap();
    assert!(r.ok, "{r:#?}");
    assert!(r.corpus >= 30, "{r:?}");
    assert_eq!(r.rejected_as_expected, r.corpus, "{r:#?}");
    assert!(r.state_unchanged);
    assert!(r.library_applied >= 5);
}
