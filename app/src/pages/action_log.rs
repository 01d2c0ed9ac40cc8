use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::audit_log::TimeField;
use crate::{
    components::{
        col, utc, ApplyOrClear, DataTable, ErrorPanel, KeysetPager, PerPage, ReplicaLagNotice,
        RequireRole,
    },
    domain::{
        action_phrase, datetime_local, ActionEntry, ActionPage, ActionQuery, Role, ACTION_SOURCES,
    },
    server_fns::list_actions,
};

/// Who did what, when: every key created or revoked, export, operator
/// change, filtered and paged like the audit log.
#[component]
pub fn ActionLogPage() -> impl IntoView {
    let params = use_query_map();
    let query = move || {
        params.with(|q| ActionQuery {
            from: q.get("from"),
            to: q.get("to"),
            operator: q.get("operator"),
            action: q.get("action"),
            via: q.get("via"),
            limit: q.get("limit"),
            after: q.get("after"),
            before: q.get("before"),
        })
    };
    let page = Resource::new(query, list_actions);
    view! {
        <Title text="Action log"/>
        <RequireRole role=Role::Viewer>
            <h1>"Action log"</h1>
            <ReplicaLagNotice/>
            <Suspense>
                {move || Suspend::new(async move {
                    let query = query();
                    match page.await {
                        Ok(page) => view! {
                            <ActionFilters query=query.clone() known=page.known_actions.clone()/>
                            <ActionTable page query/>
                        }.into_any(),
                        Err(error) => view! { <ActionFilters query known=Vec::new()/> <ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn ActionFilters(query: ActionQuery, known: Vec<String>) -> impl IntoView {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let (action, via) = (value(&query.action), value(&query.via));
    let limit = query.limit.clone().unwrap_or_else(|| "50".into());
    view! {
        <form class="filters audit-filters" method="get" action="/actions" role="search" aria-label="Filter the action log">
            <TimeField id="actions-from" name="from" label="From (UTC)" value=datetime_local(&query.from, false)/>
            <TimeField id="actions-to" name="to" label="Before (UTC)" value=datetime_local(&query.to, true)/>
            <div class="field">
                <label for="actions-operator">"Operator email"</label>
                <input id="actions-operator" name="operator" type="text" maxlength="200" value=value(&query.operator)/>
            </div>
            <div class="field">
                <label for="actions-action">"Action"</label>
                <select id="actions-action" name="action">
                    <option value="">"Any action"</option>
                    {known.into_iter().map(|name| {
                        let selected = name == action;
                        view! { <option value=name.clone() selected=selected>{action_phrase(&name)}</option> }
                    }).collect_view()}
                </select>
            </div>
            <div class="field">
                <label for="actions-via">"Source"</label>
                <select id="actions-via" name="via">
                    <option value="">"Any source"</option>
                    {ACTION_SOURCES.into_iter().map(|s| view! { <option value=s selected=via == s>{s}</option> }).collect_view()}
                </select>
            </div>
            <PerPage id="actions-limit" limit/>
            <ApplyOrClear page="/actions"/>
        </form>
    }
}

#[component]
fn ActionTable(page: ActionPage, query: ActionQuery) -> impl IntoView {
    let positioned = query.after.is_some() || query.before.is_some();
    let pager = view! {
        <KeysetPager label="Pages of actions"
            newest=positioned.then(|| query.at(None).href())
            newer=page.newer.as_ref().map(ActionQuery::href)
            older=page.older.as_ref().map(ActionQuery::href)/>
    };
    if page.actions.is_empty() {
        return view! {
            <section class="panel"><p>"No actions match these filters."</p><p class="hint"><a href="/actions">"Show every action"</a></p></section>
            {pager}
        }
        .into_any();
    }
    view! {
        <DataTable class="data actions" columns=vec![col("Time (UTC)"), col("Who"), col("What"), col("Details")]>
            {page.actions.into_iter().map(|a| {
                let source = format!("{}{}", a.via, a.ip.as_ref().map(|ip| format!(" · {ip}")).unwrap_or_default());
                view! {
                    <tr data-action=a.id>
                        <td class="nowrap">{utc(a.at)}</td>
                        <td>{a.who.clone()} <div class="hint">{source}</div></td>
                        <td><ActionWhat entry=a.clone()/></td>
                        <td><ActionDetails entry=a.clone()/></td>
                    </tr>
                }
            }).collect_view()}
        </DataTable>
        {pager}
    }
    .into_any()
}

/// What an entry did, as a phrase with what it touched linked:
/// "Revoked vault key 12".
#[component]
pub fn ActionWhat(entry: ActionEntry) -> impl IntoView {
    let phrase = action_phrase(&entry.action);
    let subject = entry.subject().map(|subject| match subject.href {
        Some(href) => view! { <a href=href>{subject.words}</a> }.into_any(),
        None => subject.words.into_any(),
    });
    let phrase = if subject.is_some() {
        format!("{phrase} ")
    } else {
        phrase
    };
    view! { <span data-action-name=entry.action.clone()>{phrase}{subject}</span> }
}

/// An entry's details as named values.
#[component]
pub fn ActionDetails(entry: ActionEntry) -> impl IntoView {
    let pairs = entry.detail_pairs();
    if pairs.is_empty() {
        return view! { <span class="hint">"—"</span> }.into_any();
    }
    view! {
        <dl class="details-list">
            {pairs.into_iter().map(|(name, value)| view! { <div><dt>{name}</dt><dd>{value}</dd></div> }).collect_view()}
        </dl>
    }
    .into_any()
}
