use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{utc, Amount, ErrorPanel, RequireRole},
    domain::{KeySummary, Me, Role},
    server_fns::list_vault_keys,
};

#[component]
pub fn VaultKeysPage() -> impl IntoView {
    let keys = OnceResource::new(list_vault_keys());
    let can_create = use_context::<Me>().is_some_and(|me| me.role.allows(Role::Operator));
    view! {
        <Title text="Vault keys"/>
        <RequireRole role=Role::Viewer>
            <div class="page-head">
                <h1>"Vault keys"</h1>
                {can_create.then(|| view! { <a class="button button-primary" href="/keys/new">"New vault key"</a> })}
            </div>
            <Suspense>
                {move || Suspend::new(async move {
                    match keys.await {
                        Ok(keys) if keys.is_empty() => view! {
                            <section class="panel">
                                <p>"No vault keys yet."</p>
                                <p class="hint">"Create one for a billing run with New vault key, or let the billing job request one from the key API."</p>
                            </section>
                        }.into_any(),
                        Ok(keys) => view! { <KeyTable keys/> }.into_any(),
                        Err(error) => view! { <ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn KeyTable(keys: Vec<KeySummary>) -> impl IntoView {
    view! {
        <table class="data">
            <thead>
                <tr>
                    <th scope="col">"Period"</th>
                    <th scope="col">"Label"</th>
                    <th scope="col">"Key"</th>
                    <th scope="col">"Status"</th>
                    <th scope="col" class="num">"Cap"</th>
                    <th scope="col" class="num">"Spent"</th>
                    <th scope="col" class="num">"Reserved"</th>
                    <th scope="col" class="num">"Utilization"</th>
                    <th scope="col">"Expires"</th>
                </tr>
            </thead>
            <tbody>
                {keys.into_iter().map(|key| {
                    let pct = key.utilization_pct();
                    let level = if pct >= 90 { "high" } else if pct >= 75 { "warn" } else { "ok" };
                    view! {
                        <tr>
                            <td class="nowrap">{key.billing_period.clone()}</td>
                            <td>{key.label.clone()}</td>
                            <td class="nowrap"><code>{key.secret_prefix.clone()} "…"</code></td>
                            <td><span class=format!("status status-{}", key.status.as_str())>{key.status.as_str()}</span></td>
                            <td class="num"><Amount cents=key.cap currency=key.currency.clone()/></td>
                            <td class="num"><Amount cents=key.spent currency=key.currency.clone()/></td>
                            <td class="num"><Amount cents=key.reserved currency=key.currency.clone()/></td>
                            <td class="num">
                                <span class=format!("util util-{level}")>
                                    <meter min="0" max="100" value=pct.min(100) aria-label="Utilization"></meter>
                                    {format!("{pct} %")}
                                </span>
                            </td>
                            <td class="nowrap">{utc(key.expires_at)}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
}
