use leptos::prelude::*;

use crate::server_fns::get_replica_lag;

/// On a page read from the replica: says how far it trails the primary,
/// once that is more than a few seconds (nothing otherwise).
#[component]
pub fn ReplicaLagNotice() -> impl IntoView {
    let lag = Resource::new(|| (), |_| get_replica_lag());
    view! {
        <Suspense>
            {move || Suspend::new(async move {
                lag.await.ok().flatten().map(|lag| view! {
                    <p class="notice notice-warning" role="status" data-testid="replica-lag">
                        "Some of this page is read from a replica up to " {lag.text()}
                        " behind the primary: the newest calls and changes may not show yet."
                    </p>
                })
            })}
        </Suspense>
    }
}
