use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::{
    components::{utc, Amount, ApplyOrClear, ErrorPanel, RequireRole, UtilizationMeter},
    domain::{KeyList, KeyQuery, KeySort, Me, Role},
    server_fns::list_vault_keys,
};

/// Every vault key, filtered, sorted and paged by a plain GET form and
/// links, so a URL reproduces the view and nothing needs JavaScript.
#[component]
pub fn VaultKeysPage() -> impl IntoView {
    let params = use_query_map();
    let query = move || {
        params.with(|q| KeyQuery {
            period: q.get("period"),
            status: q.get("status"),
            at_threshold: q.get("at_threshold"),
            q: q.get("q"),
            sort: q.get("sort"),
            dir: q.get("dir"),
            page: q.get("page"),
        })
    };
    let keys = Resource::new(query, list_vault_keys);
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
                    let query = query();
                    match keys.await {
                        Ok(list) => view! {
                            <KeyFilters query=query.clone() periods=list.periods.clone()/>
                            <KeyResults list query/>
                        }.into_any(),
                        Err(error) => view! {
                            <KeyFilters query periods=Vec::new()/>
                            <ErrorPanel error/>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn KeyFilters(query: KeyQuery, periods: Vec<String>) -> impl IntoView {
    let period = query.period.clone().unwrap_or_default();
    let status = query.status.clone().unwrap_or_default();
    let statuses = [
        ("", "All statuses"),
        ("active", "Active"),
        ("expired", "Expired"),
        ("revoked", "Revoked"),
    ];
    view! {
        <form class="filters" method="get" action="/keys" role="search" aria-label="Filter vault keys">
            <div class="field">
                <label for="filter-period">"Billing period"</label>
                <select id="filter-period" name="period">
                    <option value="">"All periods"</option>
                    {periods.into_iter().map(|p| {
                        let selected = p == period;
                        view! { <option value=p.clone() selected=selected>{p.clone()}</option> }
                    }).collect_view()}
                </select>
            </div>
            <div class="field">
                <label for="filter-status">"Status"</label>
                <select id="filter-status" name="status">
                    {statuses.into_iter().map(|(value, label)| view! {
                        <option value=value selected=status == value>{label}</option>
                    }).collect_view()}
                </select>
            </div>
            <div class="field">
                <label for="filter-q">"Label contains"</label>
                <input id="filter-q" name="q" type="search" maxlength="200" value=query.q.clone().unwrap_or_default()/>
            </div>
            <div class="field field-check">
                <input id="filter-threshold" name="at_threshold" type="checkbox" value="1"
                    checked=query.at_threshold.as_deref() == Some("1")/>
                <label for="filter-threshold">"At or above an alert threshold"</label>
            </div>
            {query.sort.clone().map(|sort| view! { <input type="hidden" name="sort" value=sort/> })}
            {query.dir.clone().map(|dir| view! { <input type="hidden" name="dir" value=dir/> })}
            <ApplyOrClear page="/keys"/>
        </form>
    }
}

#[component]
fn KeyResults(list: KeyList, query: KeyQuery) -> impl IntoView {
    if list.keys.is_empty() {
        let filtered = query != KeyQuery::default();
        return view! {
            <section class="panel">
                {if filtered {
                    view! { <p>"No vault keys match these filters."</p> <p class="hint"><a href="/keys">"Show every key"</a></p> }.into_any()
                } else {
                    view! {
                        <p>"No vault keys yet."</p>
                        <p class="hint">"Create one for a billing run with New vault key, or let the billing job request one from the key API."</p>
                    }.into_any()
                }}
            </section>
        }
        .into_any();
    }
    let filter = query.parse().ok();
    let sorting = query.clone();
    let header = move |sort: KeySort, label: &'static str, numeric: bool| {
        let current = filter.as_ref().filter(|f| f.sort == sort);
        let aria_sort = current.map(|f| {
            if f.descending {
                "descending"
            } else {
                "ascending"
            }
        });
        let arrow = current
            .map(|f| if f.descending { " ↓" } else { " ↑" })
            .unwrap_or("");
        let class = if numeric { "num" } else { "" };
        view! {
            <th scope="col" class=class aria-sort=aria_sort>
                <a class="sort" href=sorting.sorted_by(sort).href()>{format!("{label}{arrow}")}</a>
            </th>
        }
    };
    let shown = format!(
        "{} {} match",
        list.matching,
        if list.matching == 1 { "key" } else { "keys" }
    );
    view! {
        <p class="result-count">{shown}</p>
        <div class="table-scroll" tabindex="0">
            <table class="data keys">
                <thead>
                    <tr>
                        {header(KeySort::Period, "Period", false)}
                        {header(KeySort::Label, "Label", false)}
                        <th scope="col">"Key"</th>
                        <th scope="col">"Status"</th>
                        {header(KeySort::Cap, "Cap", true)}
                        {header(KeySort::Spent, "Spent", true)}
                        <th scope="col" class="num">"Reserved"</th>
                        {header(KeySort::Utilization, "Utilization", true)}
                        {header(KeySort::Expires, "Expires", false)}
                    </tr>
                </thead>
                <tbody>
                    {list.keys.into_iter().map(|key| view! {
                        <tr data-key=key.id>
                            <td class="nowrap">{key.billing_period.to_string()}</td>
                            <td class="label"><a href=format!("/keys/{}", key.id) title=key.label.clone()>{key.label.clone()}</a></td>
                            <td class="nowrap"><code>{format!("{}…", key.secret_prefix)}</code></td>
                            <td><span class=format!("status status-{}", key.status.as_str())>{key.status.as_str()}</span></td>
                            <td class="num"><Amount cents=key.cap currency=key.currency.clone()/></td>
                            <td class="num"><Amount cents=key.spent currency=key.currency.clone()/></td>
                            <td class="num"><Amount cents=key.reserved currency=key.currency.clone()/></td>
                            <td class="num"><UtilizationMeter key=key.clone()/></td>
                            <td class="nowrap">{utc(key.expires_at)}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </div>
        <Pager page=list.page pages=list.pages query/>
    }
    .into_any()
}

#[component]
fn Pager(page: i64, pages: i64, query: KeyQuery) -> impl IntoView {
    (pages > 1).then(|| {
        view! {
            <nav class="pager" aria-label="Pages of keys">
                {(page > 1).then(|| view! { <a rel="prev" href=query.with_page(page - 1).href()>"← Previous"</a> })}
                <span>{format!("Page {page} of {pages}")}</span>
                {(page < pages).then(|| view! { <a rel="next" href=query.with_page(page + 1).href()>"Next →"</a> })}
            </nav>
        }
    })
}
