use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{col, utc, DataTable, ErrorPanel, RequireRole},
    domain::{Me, OperatorSummary, Role},
    server_fns::list_operators,
};

/// Admins add operators, change their roles and disable them. Each change is
/// a plain form post handled by the server and recorded in the action log.
#[component]
pub fn OperatorsPage() -> impl IntoView {
    view! {
        <Title text="Operators"/>
        <RequireRole role=Role::Admin>
            <OperatorsAdmin/>
        </RequireRole>
    }
}

#[component]
fn OperatorsAdmin() -> impl IntoView {
    let operators = OnceResource::new(list_operators());
    let me = use_context::<Me>();
    view! {
        <h1>"Operators"</h1>
        <AddOperatorForm/>
        <Suspense>
            {move || {
                let me = me.clone();
                Suspend::new(async move {
                    match operators.await {
                        Ok(operators) => view! { <OperatorTable operators me/> }.into_any(),
                        Err(error) => view! { <ErrorPanel error/> }.into_any(),
                    }
                })
            }}
        </Suspense>
    }
}

#[component]
fn AddOperatorForm() -> impl IntoView {
    view! {
        <form class="panel form-inline" method="post" action="/operators" aria-labelledby="add-operator">
            <h2 id="add-operator">"Add an operator"</h2>
            <div class="field">
                <label for="new-email">"Email"</label>
                <input id="new-email" name="email" type="email" required autocomplete="off"/>
            </div>
            <div class="field">
                <label for="new-role">"Role"</label>
                <RoleSelect id="new-role" selected=Role::Viewer described=true/>
            </div>
            <button type="submit" class="button button-primary">"Add operator"</button>
            <p class="hint">"An invitation link is shown once, for you to pass on: it works once, within 24 hours, for them to set their own password."</p>
        </form>
    }
}

#[component]
fn RoleSelect(
    #[prop(into)] id: String,
    selected: Role,
    /// Say what each role may do (where there is room for it).
    #[prop(optional)]
    described: bool,
) -> impl IntoView {
    view! {
        <select id=id name="role">
            {Role::ALL.into_iter().map(|role| {
                let text = if described {
                    format!("{} — {}", role.as_str(), role.describe())
                } else {
                    role.as_str().to_string()
                };
                view! { <option value=role.as_str() selected=role == selected>{text}</option> }
            }).collect_view()}
        </select>
    }
}

#[component]
fn OperatorTable(operators: Vec<OperatorSummary>, me: Option<Me>) -> impl IntoView {
    let my_id = me.map(|me| me.id);
    view! {
        <DataTable class="data" columns=vec![col("Email"), col("Role"), col("Status"), col("Added"), col("Actions")] caption="Everyone who can sign in" caption_shown=true>
            {operators.into_iter().map(|op| {
                let role_select_id = format!("role-{}", op.id);
                let is_me = my_id == Some(op.id);
                view! {
                    <tr data-operator=op.email.clone()>
                        <td>{op.email.clone()} {is_me.then_some(view! { <span class="muted">" (you)"</span> })}</td>
                        <td>
                            <form class="row-form" method="post" action=format!("/operators/{}/role", op.id)>
                                <label class="visually-hidden" for=role_select_id.clone()>
                                    {format!("Role of {}", op.email)}
                                </label>
                                <RoleSelect id=role_select_id selected=op.role/>
                                <button type="submit" class="button button-quiet">"Change role"</button>
                            </form>
                        </td>
                        <td>
                            <span class=if op.disabled { "status status-revoked" } else { "status status-active" }>
                                {if op.disabled { "disabled" } else { "active" }}
                            </span>
                        </td>
                        <td class="nowrap">{utc(op.created_at)}</td>
                        <td>
                            <form class="row-form" method="post" action=format!("/operators/{}/disabled", op.id)>
                                <input type="hidden" name="disabled" value=if op.disabled { "false" } else { "true" }/>
                                <button type="submit" class="button button-quiet" disabled=is_me && !op.disabled
                                    aria-label=format!("{} {}", if op.disabled { "Enable" } else { "Disable" }, op.email)>
                                    {if op.disabled { "Enable" } else { "Disable" }}
                                </button>
                            </form>
                        </td>
                    </tr>
                }
            }).collect_view()}
        </DataTable>
    }
}
