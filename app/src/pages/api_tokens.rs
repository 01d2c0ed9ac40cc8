use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{col, utc, DataTable, ErrorPanel, RequireRole},
    domain::{
        group_thousands, ApiScope, ApiTokenSummary, Role, TokenStatus, DEFAULT_TOKEN_DAYS,
        MAX_TOKEN_DAYS,
    },
    server_fns::list_api_tokens,
};

/// Admins make scoped, expiring tokens for billing jobs and tools, and
/// revoke them. Each change is a plain form post recorded in the action log.
#[component]
pub fn ApiTokensPage() -> impl IntoView {
    view! {
        <Title text="API tokens"/>
        <RequireRole role=Role::Admin>
            <ApiTokensAdmin/>
        </RequireRole>
    }
}

#[component]
fn ApiTokensAdmin() -> impl IntoView {
    let tokens = OnceResource::new(list_api_tokens());
    view! {
        <h1>"API tokens"</h1>
        <NewTokenForm/>
        <Suspense>
            {move || Suspend::new(async move {
                match tokens.await {
                    Ok(tokens) if tokens.is_empty() => view! {
                        <p class="panel empty">"No API tokens yet. A billing job needs one with "
                            <code>"keys:create"</code>" to create its period's key."</p>
                    }.into_any(),
                    Ok(tokens) => view! { <TokenTable tokens/> }.into_any(),
                    Err(error) => view! { <ErrorPanel error/> }.into_any(),
                }
            })}
        </Suspense>
    }
}

#[component]
fn NewTokenForm() -> impl IntoView {
    view! {
        <form class="panel form-inline token-form" method="post" action="/tokens" aria-labelledby="new-token">
            <h2 id="new-token">"New API token"</h2>
            <div class="field">
                <label for="token-name">"Name"</label>
                <input id="token-name" name="name" required maxlength="200" autocomplete="off"
                    placeholder="billing job (prod)" class="wide"/>
            </div>
            <fieldset class="choices">
                <legend>"Scopes: what it may do"</legend>
                {ApiScope::ALL.into_iter().map(|scope| {
                    let id = format!("scope-{}", scope.as_str().replace(':', "-"));
                    let label_for = id.clone();
                    view! {
                        <label class="check" for=label_for>
                            <input type="checkbox" id=id name="scope" value=scope.as_str()/>
                            <code>{scope.as_str()}</code>" — "{scope.describe()}
                        </label>
                    }
                }).collect_view()}
            </fieldset>
            <div class="field">
                <label for="token-days">"Expires after (days)"</label>
                <input id="token-days" name="days" type="number" min="1" max=MAX_TOKEN_DAYS
                    value=DEFAULT_TOKEN_DAYS required inputmode="numeric"/>
            </div>
            <div class="field">
                <label for="token-ceiling">"Largest cap without an approver (cents, optional)"</label>
                <input id="token-ceiling" name="max_cap_cents" inputmode="numeric" autocomplete="off"
                    placeholder="no ceiling beyond the key policy"/>
            </div>
            <button type="submit" class="button button-primary">"Create token"</button>
            <p class="hint">"The token is shown once, on the next page. Only its hash is kept."</p>
        </form>
    }
}

#[component]
fn TokenTable(tokens: Vec<ApiTokenSummary>) -> impl IntoView {
    view! {
        <DataTable class="data" columns=vec![col("Name"), col("Token"), col("Scopes"), col("Status"), col("Created"), col("Expires"), col("Last used"), col("Actions")] caption="Every API token, working ones first" caption_shown=true>
            {tokens.into_iter().map(|token| view! { <TokenRow token/> }).collect_view()}
        </DataTable>
    }
}

#[component]
fn TokenRow(token: ApiTokenSummary) -> impl IntoView {
    let status_class = match token.status {
        TokenStatus::Active => "status status-active",
        TokenStatus::Expired => "status status-expired",
        TokenStatus::Revoked => "status status-revoked",
    };
    let revoke = (token.status == TokenStatus::Active).then(|| {
        view! {
            <form class="row-form" method="post" action=format!("/tokens/{}/revoke", token.id)>
                <button type="submit" class="button button-quiet"
                    aria-label=format!("Revoke the token {}", token.name)>"Revoke"</button>
            </form>
        }
    });
    view! {
        <tr data-token=token.name.clone()>
            <th scope="row">{token.name.clone()}</th>
            <td><code>{format!("{}…", token.prefix)}</code></td>
            <td>
                <ul class="scopes">
                    {token.scopes.iter().map(|scope| view! { <li><code>{scope.as_str()}</code></li> }).collect_view()}
                </ul>
                {token.max_cap_cents.map(|cents| view! {
                    <div class="hint">{format!("keys up to {} (minor units) without an approver", group_thousands(cents.0.unsigned_abs()))}</div>
                })}
            </td>
            <td><span class=status_class>{token.status.as_str()}</span></td>
            <td class="nowrap">{utc(token.created_at)}<br/><span class="muted">{token.created_by.clone()}</span></td>
            <td class="nowrap">{utc(token.expires_at)}</td>
            <td class="nowrap">{token.last_used_at.map(utc).unwrap_or_else(|| "never".into())}</td>
            <td>{revoke}</td>
        </tr>
    }
}
